"""Admin for support: every fleet model, read-mostly; writes still go through the same models' validation."""

from django.contrib import admin

from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ("name", "driver", "operator_namespace", "connection_state", "last_contact_at")
    list_filter = ("driver", "connection_state")
    search_fields = ("name",)


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "node_selector")
    list_filter = ("cluster",)
    search_fields = ("name",)


class GpuInline(admin.TabularInline):
    model = Gpu
    fields = ("index", "uuid", "product", "mig_enabled", "health", "utilization_pct", "gone_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "cluster", "pool", "ready", "observed_mode", "config_state", "last_seen_at", "gone_at")
    list_filter = ("cluster", "pool", "observed_mode", "config_state", "ready")
    search_fields = ("name",)
    list_select_related = ("cluster", "pool")
    inlines = [GpuInline]


class MigDeviceInline(admin.TabularInline):
    model = MigDevice
    fields = ("profile", "start", "size", "uuid", "in_use_by")
    extra = 0


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "product", "uuid", "mig_enabled", "health", "utilization_pct", "gone_at")
    list_filter = ("product", "mig_capable", "mig_enabled", "health")
    search_fields = ("uuid", "node__name", "pci_bus_id")
    list_select_related = ("node",)
    raw_id_fields = ("node",)
    inlines = [MigDeviceInline]


@admin.register(MigDevice)
class MigDeviceAdmin(admin.ModelAdmin):
    list_display = ("__str__", "profile", "start", "size", "uuid", "in_use_by")
    list_filter = ("profile",)
    search_fields = ("uuid", "gpu__uuid", "gpu__node__name")
    raw_id_fields = ("gpu",)
