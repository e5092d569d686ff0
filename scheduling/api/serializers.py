"""Schedules as JSON, windows and exception dates nested; transitions with UTC and local times."""

import zoneinfo
from datetime import time, timedelta

from django.utils import timezone
from rest_framework import serializers

from core.api.fields import RefField, ref_to
from fleet.models import NodePool
from scheduling.models import Schedule, ScheduleException, ScheduleWindow
from sharing.models import QoSPolicy, SharingProfile


class ScheduleWindowSerializer(serializers.ModelSerializer):
    profile = RefField("sharingprofile-detail", queryset=SharingProfile.objects.all())
    qos_policy = RefField("qospolicy-detail", queryset=QoSPolicy.objects.all(), allow_null=True, required=False)
    weekdays = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=6), allow_empty=False)

    class Meta:
        model = ScheduleWindow
        fields = ["name", "weekdays", "start", "end", "profile", "qos_policy"]


class ScheduleExceptionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ScheduleException
        fields = ["date", "note"]


class ScheduleSerializer(serializers.ModelSerializer):
    """A pool's schedule; writing `windows` or `exceptions` replaces them as a whole."""

    pool = RefField("nodepool-detail", queryset=NodePool.objects.all())
    baseline_profile = RefField(
        "sharingprofile-detail", queryset=SharingProfile.objects.all(), allow_null=True, required=False
    )
    baseline_qos_policy = RefField(
        "qospolicy-detail", queryset=QoSPolicy.objects.all(), allow_null=True, required=False
    )
    windows = ScheduleWindowSerializer(many=True)
    exceptions = ScheduleExceptionSerializer(many=True, required=False)

    class Meta:
        model = Schedule
        fields = [
            "id",
            "url",
            "pool",
            "name",
            "time_zone",
            "baseline_profile",
            "baseline_qos_policy",
            "busy_policy",
            "wait_minutes",
            "enabled",
            "windows",
            "exceptions",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {"time_zone": {"validators": []}}

    def validate_time_zone(self, value):
        if value not in zoneinfo.available_timezones():
            raise serializers.ValidationError(f"{value!r} is not an IANA time zone (e.g. Europe/Berlin).")
        return value


class DayNightSerializer(serializers.Serializer):
    """The day/night preset: one window on weekdays, the night profile outside it."""

    pool = serializers.PrimaryKeyRelatedField(queryset=NodePool.objects.all())
    day_profile = serializers.PrimaryKeyRelatedField(queryset=SharingProfile.objects.all())
    night_profile = serializers.PrimaryKeyRelatedField(queryset=SharingProfile.objects.all())
    day_qos_policy = serializers.PrimaryKeyRelatedField(queryset=QoSPolicy.objects.all(), allow_null=True, default=None)
    night_qos_policy = serializers.PrimaryKeyRelatedField(
        queryset=QoSPolicy.objects.all(), allow_null=True, default=None
    )
    time_zone = serializers.CharField()
    day_start = serializers.TimeField(default=time(8))
    day_end = serializers.TimeField(default=time(20))
    weekdays = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=6), default=[0, 1, 2, 3, 4])

    validate_time_zone = ScheduleSerializer.validate_time_zone


class TransitionSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    local = serializers.SerializerMethodField()
    schedule = RefField("schedule-detail", read_only=True)
    pool = serializers.SerializerMethodField()
    from_profile = RefField("sharingprofile-detail", read_only=True, allow_null=True)
    to_profile = RefField("sharingprofile-detail", read_only=True, allow_null=True)
    from_qos = RefField("qospolicy-detail", read_only=True, allow_null=True)
    to_qos = RefField("qospolicy-detail", read_only=True, allow_null=True)
    nodes = serializers.IntegerField()

    def get_local(self, t) -> str:
        return t.local.isoformat()

    def get_pool(self, t) -> str:
        return t.schedule.pool.name


class TransitionRangeSerializer(serializers.Serializer):
    start = serializers.DateTimeField(required=False)
    end = serializers.DateTimeField(required=False)

    def validate(self, attrs):
        """The range with its defaults (from now, for 7 days), checked whole: an `end` alone can be before now."""
        start = attrs.get("start") or timezone.now()
        end = attrs.get("end") or start + timedelta(days=7)
        if not start < end:
            raise serializers.ValidationError({"end": ["end must be after start."]})
        if (end - start).days > 62:
            raise serializers.ValidationError({"end": ["Ask for at most 62 days at a time."]})
        return {"start": start, "end": end}


class UpcomingSerializer(serializers.Serializer):
    hours = serializers.IntegerField(min_value=1, max_value=24 * 31, default=48)


class DesiredStateSerializer(serializers.Serializer):
    """A node's desired profile (and where it comes from) beside what it reports."""

    node = serializers.SerializerMethodField()
    desired_profile = serializers.SerializerMethodField()
    source = serializers.CharField()
    desired_mig_config = serializers.CharField(allow_null=True)
    desired_device_plugin_config = serializers.CharField(allow_null=True)
    observed_mode = serializers.CharField()
    observed_mig_config = serializers.CharField()
    observed_device_plugin_config = serializers.CharField()
    config_state = serializers.CharField()
    in_sync = serializers.BooleanField(allow_null=True)
    problems = serializers.ListField(child=serializers.CharField())

    def get_node(self, row) -> dict:
        return ref_to(row.node, "node-detail", self.context.get("request"))

    def get_desired_profile(self, row) -> dict | None:
        if row.profile is None:
            return None
        return ref_to(row.profile, "sharingprofile-detail", self.context.get("request"))
