"""Schedules as JSON, windows and exception dates nested; transitions with UTC and local times."""

from datetime import time, timedelta

from django.utils import timezone
from rest_framework import serializers

from core.api.fields import RefField, ref_to
from core.api.filters import QuerySerializer
from fleet.models import NodePool
from scheduling import windows
from scheduling.assign import AssignMode
from scheduling.models import Schedule, ScheduleException, ScheduleWindow
from sharing.api import serializers as sharing_serializers
from sharing.models import QoSPolicy, SharingProfile

DRY_RUN_HELP = (
    "true: check and answer what saving would do (nodes, GPU resets, pods losing their slice, when), writing "
    "nothing and starting no rollout; also `?dry_run=true`."
)


class WholeRow(serializers.ModelSerializer):
    """A row of a list written as a whole: its required fields stay required in a PATCH (DRF skips every required
    field under `partial`, nested ones too, and the services need whole rows)."""

    def validate(self, attrs):
        missing = [n for n, f in self.fields.items() if f.required and not f.read_only and n not in attrs]
        if missing:
            raise serializers.ValidationError({name: [self.error_messages["required"]] for name in missing})
        return super().validate(attrs)

    default_error_messages = {"required": "This field is required."}


class ScheduleWindowSerializer(WholeRow):
    profile = RefField("sharingprofile-detail", queryset=SharingProfile.objects.all())
    qos_policy = RefField("qospolicy-detail", queryset=QoSPolicy.objects.all(), allow_null=True, required=False)
    weekdays = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=6), allow_empty=False)

    class Meta:
        model = ScheduleWindow
        fields = ["name", "weekdays", "start", "end", "profile", "qos_policy"]


class ScheduleExceptionSerializer(WholeRow):
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
    dry_run = serializers.BooleanField(write_only=True, required=False, default=False, help_text=DRY_RUN_HELP)

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
            "dry_run",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {"time_zone": {"validators": []}}

    def validate_time_zone(self, value):
        if value not in windows.time_zones():
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
    dry_run = serializers.BooleanField(required=False, default=False, help_text=DRY_RUN_HELP)

    validate_time_zone = ScheduleSerializer.validate_time_zone


class ScheduleChangeSerializer(serializers.Serializer):
    """What the schedule would do at one moment to its pool's unpinned nodes (a profile preview per node)."""

    when = serializers.ChoiceField(choices=["now", "transition"], help_text="at once on saving, or its next switch")
    at = serializers.DateTimeField()
    profile = RefField("sharingprofile-detail", read_only=True, allow_null=True, help_text="null: no profile")
    qos_policy = RefField("qospolicy-detail", read_only=True, allow_null=True, help_text="null: none")
    refused = serializers.CharField(help_text="why the profile cannot run there at all ('' otherwise)")
    summary = sharing_serializers.PreviewSummarySerializer()
    nodes = sharing_serializers.NodeImpactSerializer(source="impacts", many=True)


class DryRunSerializer(serializers.Serializer):
    """The answer to `dry_run`: nothing was written, and this is what saving would do."""

    dry_run = serializers.BooleanField()
    impact = ScheduleChangeSerializer(many=True)


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


class TransitionRangeSerializer(QuerySerializer):
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


class UpcomingSerializer(QuerySerializer):
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


class ScheduleRuleSerializer(serializers.Serializer):
    """The pool's schedule setting its profile now (scheduling.assign.ScheduleRule)."""

    schedule = serializers.SerializerMethodField()
    profile = serializers.SerializerMethodField(help_text="the profile the schedule sets now")
    window = serializers.SerializerMethodField(help_text="the window in force, by name; null: the baseline")
    until = serializers.DateTimeField(allow_null=True, help_text="its next change of profile; null: none in 8 days")
    next_profile = serializers.SerializerMethodField(help_text="what it sets from `until`; null: the pool's default")
    default_from = serializers.DateTimeField(
        allow_null=True, help_text="when the pool's default profile next applies; null: not within 8 days"
    )
    pinned = serializers.IntegerField(help_text="the pool's nodes with a pin of their own")
    message = serializers.CharField()

    def get_schedule(self, rule) -> dict:
        return ref_to(rule.schedule, "schedule-detail", self.context.get("request"))

    def get_profile(self, rule) -> dict:
        return ref_to(rule.profile, "sharingprofile-detail", self.context.get("request"))

    def get_window(self, rule) -> str | None:
        return rule.window.name if rule.window is not None else None

    def get_next_profile(self, rule) -> dict | None:
        if rule.next_profile is None:
            return None
        return ref_to(rule.next_profile, "sharingprofile-detail", self.context.get("request"))


class AssignRequestSerializer(serializers.Serializer):
    pool = serializers.PrimaryKeyRelatedField(queryset=NodePool.objects.all())
    mode = serializers.ChoiceField(
        choices=AssignMode.choices,
        default=AssignMode.DEFAULT,
        help_text="default: the pool's default profile (applies once no schedule sets the pool's profile); window: "
        "replace the profile of the schedule's window (or baseline) in force now, admins only; "
        "pin_until_next_transition: pin the pool's nodes without a pin until the schedule's next transition",
    )


class AssignmentSerializer(serializers.Serializer):
    mode = serializers.CharField()
    message = serializers.CharField(help_text="what happens and when, in words")
    applies_from = serializers.DateTimeField(allow_null=True, help_text="null: not within the next 8 days")
    schedule = ScheduleRuleSerializer(source="rule", allow_null=True, help_text="null: no schedule sets it now")
    pinned_until = serializers.DateTimeField(allow_null=True)
    pins = serializers.IntegerField(help_text="nodes pinned by this assignment")


class PreviewSerializer(sharing_serializers.PreviewSerializer):
    schedule = ScheduleRuleSerializer(allow_null=True, help_text="for a pool: its schedule's hold now; else null")


class AssignResponseSerializer(sharing_serializers.SharingProfileSerializer):
    assignment = AssignmentSerializer(read_only=True)

    class Meta(sharing_serializers.SharingProfileSerializer.Meta):
        fields = [*sharing_serializers.SharingProfileSerializer.Meta.fields, "assignment"]
