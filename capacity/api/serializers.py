"""The GPU-hours endpoint's query and answer."""

from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from capacity.selectors import GROUPS
from core.api.filters import QuerySerializer
from fleet.models import NodePool

MAX_DAYS = 366


def _today():
    return timezone.localdate()


def _week_ago():
    return timezone.localdate() - timedelta(days=6)


class _GpuHoursQuery(QuerySerializer):
    pool = serializers.PrimaryKeyRelatedField(queryset=NodePool.objects.all(), required=False, allow_null=True)
    to = serializers.DateField(default=_today, help_text="Last day, inclusive (default today).")
    group_by = serializers.ChoiceField(choices=sorted(GROUPS), default="namespace")

    def validate(self, attrs):
        start, end = attrs["from"], attrs["to"]
        if end < start:
            raise serializers.ValidationError({"to": ["Give a day on or after `from`."]})
        if (end - start).days >= MAX_DAYS:
            raise serializers.ValidationError({"to": [f"Ask for at most {MAX_DAYS} days at a time."]})
        return attrs


# `from` is a Python keyword: the field is added under its query name.
GpuHoursQuerySerializer = type(
    "GpuHoursQuerySerializer",
    (_GpuHoursQuery,),
    {"from": serializers.DateField(default=_week_ago, help_text="First day (default 6 days ago).")},
)


class GpuHoursRowSerializer(serializers.Serializer):
    day = serializers.DateField()
    group = serializers.CharField(help_text="The namespace, or the team label's value ('' when the pod has none).")
    resource = serializers.CharField()
    gpu_hours = serializers.FloatField()


class ReconciliationSerializer(serializers.Serializer):
    groups_gpu_hours = serializers.FloatField()
    pool_used_gpu_hours = serializers.FloatField()
    difference_gpu_hours = serializers.FloatField()
    sample_minutes = serializers.IntegerField()
    statement = serializers.CharField()


class GpuHoursSerializer(serializers.Serializer):
    rows = GpuHoursRowSerializer(many=True)
    reconciliation = ReconciliationSerializer()
