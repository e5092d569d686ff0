"""Audit events as JSON."""

from rest_framework import serializers

from core.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor_label", "actor_kind", "action", "object_type", "object_id", "object_repr",
                  "before", "after", "message"]  # fmt: skip
