from django.contrib import admin

from core.models import ApiToken, AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: the audit log is append-only, for support as well."""

    list_display = ("at", "actor_label", "actor_kind", "action", "object_type", "object_repr")
    list_filter = ("actor_kind", "action", "object_type")
    search_fields = ("actor_label", "object_repr", "message")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Users' API tokens: listed (only their hash is stored) and revoked by deleting; users make their own."""

    list_display = ("user", "key_id", "created_at", "expires_at")
    search_fields = ("user__username", "key_id")
    list_select_related = ("user",)
    readonly_fields = ("user", "key_id", "created_at", "expires_at")
    exclude = ("secret_hash",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
