from django.contrib import admin

from sharing.models import NodePin, PoolSharing, SharingProfile


@admin.register(SharingProfile)
class SharingProfileAdmin(admin.ModelAdmin):
    list_display = ("name", "mode", "mig_strategy", "replicas", "updated_at")
    list_filter = ("mode",)
    search_fields = ("name",)


@admin.register(PoolSharing)
class PoolSharingAdmin(admin.ModelAdmin):
    list_display = ("pool", "profile", "updated_at")


@admin.register(NodePin)
class NodePinAdmin(admin.ModelAdmin):
    list_display = ("node", "profile", "reason", "pinned_by", "created_at")
    raw_id_fields = ("node",)
