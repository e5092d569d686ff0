"""Filters for the audit log: who, what, which object, when."""

import django_filters

from core.models import AuditEvent


class AuditEventFilterSet(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor_label", lookup_expr="icontains", label="Who")
    action = django_filters.CharFilter(lookup_expr="startswith", label="Action (prefix, e.g. rollout.)")
    object_type = django_filters.CharFilter(label="Object type")
    object_id = django_filters.CharFilter(label="Object id")
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte", label="Since")
    until = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt", label="Until")

    class Meta:
        model = AuditEvent
        fields = ["actor", "actor_kind", "action", "object_type", "object_id", "since", "until"]
