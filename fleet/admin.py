"""Admin for support: every fleet model, read-mostly; writes still go through the same models' validation."""

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.http import HttpResponseRedirect
from django.urls import reverse

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet import services
from fleet.agent_credentials import agent_credential_revoke, agent_join_token_revoke
from fleet.cluster_access import cluster_access_errors
from fleet.models import (
    AgentCredential,
    AgentJoinToken,
    Cluster,
    Gpu,
    GpuEvent,
    MigDevice,
    Node,
    NodePool,
    PendingAgent,
    UuidConflict,
)


class ServiceAdmin(admin.ModelAdmin):
    """Saves and deletes go through the fleet services (validated and audited like the API's); a domain rule's
    refusal (e.g. admission objects still in the cluster) is shown, not a 500."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ApplicationError as error:
            return self._refused(request, error, object_id)

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except ApplicationError as error:
            return self._refused(request, error, object_id)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)

    def _refused(self, request, error: ApplicationError, object_id):
        self.message_user(request, error.message, level=messages.ERROR)
        info = self.model._meta.app_label, self.model._meta.model_name
        if object_id:
            return HttpResponseRedirect(reverse("admin:{}_{}_change".format(*info), args=[object_id]))
        return HttpResponseRedirect(reverse("admin:{}_{}_changelist".format(*info)))

    @staticmethod
    def _values(form, fields) -> dict:
        return {key: form.cleaned_data[key] for key in fields if key in form.cleaned_data}


class ClusterAdminForm(forms.ModelForm):
    """The services' checks of what the worker may read and fetch, shown beside their fields."""

    def clean(self):
        data = super().clean()
        values = {key: data.get(key) or "" for key in ("kubeconfig_path", "metrics_url", "prometheus_url")}
        for field, messages_ in cluster_access_errors(**values).items():
            for message in messages_:
                self.add_error(field, message)
        return data


@admin.register(Cluster)
class ClusterAdmin(ServiceAdmin):
    form = ClusterAdminForm
    list_display = ("name", "driver", "operator_namespace", "connection_state", "last_contact_at")
    list_filter = ("driver", "connection_state")
    search_fields = ("name",)
    readonly_fields = ("connection_state", "last_contact_at", "last_error", "last_error_at")  # observed, not set
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}  # Django 6's default, said now

    def save_model(self, request, obj, form, change):
        values, actor = self._values(form, services.CLUSTER_EDITABLE), Actor.for_user(request.user)
        if change:
            saved = services.cluster_update(actor=actor, cluster=obj, **values)
        else:
            saved = services.cluster_create(actor=actor, **values)
        obj.pk, obj.updated_at = saved.pk, saved.updated_at

    def delete_model(self, request, obj):
        services.cluster_delete(actor=Actor.for_user(request.user), cluster=obj)


@admin.register(NodePool)
class NodePoolAdmin(ServiceAdmin):
    list_display = ("name", "cluster", "node_selector")
    list_filter = ("cluster",)
    search_fields = ("name",)

    def get_readonly_fields(self, request, obj=None):
        return ("cluster",) if obj else ()  # as in the API: a pool's cluster is chosen at creation

    def save_model(self, request, obj, form, change):
        values, actor = self._values(form, services.POOL_EDITABLE), Actor.for_user(request.user)
        if change:
            saved = services.pool_update(actor=actor, pool=obj, **values)
        else:
            saved = services.pool_create(actor=actor, cluster=form.cleaned_data["cluster"], **values)
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        services.pool_delete(actor=Actor.for_user(request.user), pool=obj)


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
    readonly_fields = ("pool",)  # membership changes go through the pool (explicit members or its selector), audited
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


def _revoke_each(modeladmin, request, queryset, revoke) -> None:
    """Revoke through the service (audit event per row); already revoked rows are reported, not an error."""
    actor, done = Actor.for_user(request.user), 0
    for row in queryset:
        try:
            revoke(actor, row)
            done += 1
        except ApplicationError as error:
            modeladmin.message_user(request, error.message, messages.WARNING)
    modeladmin.message_user(request, f"Revoked {done}.")


@admin.register(AgentJoinToken)
class AgentJoinTokenAdmin(admin.ModelAdmin):
    """Created through the API (the token is shown once there); here listed and revoked."""

    list_display = ("name", "cluster", "key_id", "uses", "max_uses", "expires_at", "revoked_at", "created_by")
    list_filter = ("cluster",)
    search_fields = ("name", "key_id")
    list_select_related = ("cluster", "created_by")
    # What limits a token is set when it is created (validated and audited there): read-only here.
    readonly_fields = ("cluster", "key_id", "uses", "node_name_pattern", "service_account", "created_by",
                       "created_at", "last_used_at", "revoked_at")  # fmt: skip
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected join tokens")
    def revoke(self, request, queryset):
        _revoke_each(self, request, queryset, lambda actor, t: agent_join_token_revoke(actor=actor, token=t))


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    list_display = ("node", "key_id", "join_token", "created_at", "last_used_at", "revoked_at")
    list_filter = ("node__cluster",)
    search_fields = ("node__name", "key_id")
    list_select_related = ("node", "join_token")
    readonly_fields = ("node", "join_token", "key_id", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected agent credentials")
    def revoke(self, request, queryset):
        _revoke_each(self, request, queryset, lambda actor, c: agent_credential_revoke(actor=actor, credential=c))


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written by services or agents (audited there): listed here, never added or changed by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(GpuEvent)
class GpuEventAdmin(_ReadOnlyAdmin):
    """Append-only: XID and ECC events as agents reported them."""

    list_display = ("at", "gpu", "kind", "code", "message")
    list_filter = ("kind", "code")
    search_fields = ("gpu__uuid", "gpu__node__name")
    list_select_related = ("gpu__node",)
    raw_id_fields = ("gpu",)


@admin.register(PendingAgent)
class PendingAgentAdmin(_ReadOnlyAdmin):
    """Decided on the Agent join tokens page or through /api/v1/pending-agents/."""

    list_display = ("node", "fingerprint", "status", "address", "requested_at", "decided_by")
    list_filter = ("status", "node__cluster")
    search_fields = ("node__name", "key_hash")
    list_select_related = ("node", "decided_by")


@admin.register(UuidConflict)
class UuidConflictAdmin(_ReadOnlyAdmin):
    list_display = ("node", "holder", "kind", "uuid", "first_seen_at", "reports", "resolved_at")
    list_filter = ("kind",)
    search_fields = ("uuid", "node__name", "holder__name")
    list_select_related = ("node", "holder")
