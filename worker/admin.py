from django.contrib import admin

from worker.models import AdmissionPolicyState, NodeChange, Rollout


class NodeChangeInline(admin.TabularInline):
    model = NodeChange
    fields = ("node", "status", "attempts", "applied_mig_config", "error")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    """Read-mostly for support: steer rollouts through the UI or API so every transition is audited."""

    list_display = ("__str__", "trigger", "status", "actor_label", "created_at", "finished_at")
    list_filter = ("status", "trigger")
    inlines = [NodeChangeInline]


@admin.register(NodeChange)
class NodeChangeAdmin(admin.ModelAdmin):
    list_display = ("node", "rollout", "status", "attempts", "updated_at")
    list_filter = ("status",)
    raw_id_fields = ("node", "rollout")
    search_fields = ("node__name",)


@admin.register(AdmissionPolicyState)
class AdmissionPolicyStateAdmin(admin.ModelAdmin):
    """Read-only: the admission sync owns these rows (they mirror objects in the clusters). Deleting one here would
    leave its policy denying pods in the cluster with nothing left to remove it."""

    list_display = ("object_name", "cluster", "pool_name", "policy_name", "state", "applied_at", "checked_at")
    list_filter = ("state", "cluster")
    search_fields = ("object_name", "pool_name", "policy_name")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
