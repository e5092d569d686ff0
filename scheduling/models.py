"""Schedules: per pool, windows of the week (in the schedule's own time zone) that switch the sharing profile."""

from django.core.exceptions import ValidationError
from django.db import models
from django.urls import reverse

from core.fields import NameField
from fleet.models import NodePool
from scheduling import windows
from sharing.choices import BusyPolicy
from sharing.models import QoSPolicy, SharingProfile


def validate_time_zone(value: str) -> None:
    if value not in windows.time_zones():
        raise ValidationError(f"{value!r} is not an IANA time zone (e.g. Europe/Berlin).")


class Schedule(models.Model):
    """A pool's calendar: windows → profile, a baseline outside them, exception dates, the policy for busy GPUs."""

    pool = models.OneToOneField(NodePool, on_delete=models.CASCADE, related_name="schedule")
    name = NameField(max_length=100)
    time_zone = models.CharField(max_length=64, default="UTC", validators=[validate_time_zone])
    baseline_profile = models.ForeignKey(
        SharingProfile,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        help_text="Outside every window. Empty: the pool's default profile.",
    )
    baseline_qos_policy = models.ForeignKey(
        QoSPolicy,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        help_text="Outside every window. Empty: the pool's default QoS policy.",
    )
    busy_policy = models.CharField(max_length=10, choices=BusyPolicy.choices, default=BusyPolicy.WAIT)
    wait_minutes = models.PositiveIntegerField(default=30)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool__name"]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("scheduling:schedule_detail", args=[self.pk])

    def to_calendar(self) -> windows.Calendar:
        """The pure calendar of this schedule; values are (profile id, QoS policy id), None meaning the pool's."""
        return windows.Calendar(
            tz=self.time_zone,
            windows=tuple(
                windows.Window(frozenset(w.weekdays), w.start, w.end, (w.profile_id, w.qos_policy_id), w.name)
                for w in self.windows.all()
            ),
            baseline=(self.baseline_profile_id, self.baseline_qos_policy_id),
            exceptions=frozenset(e.date for e in self.exceptions.all()),
        )


class ScheduleWindow(models.Model):
    """Weekdays (0 = Monday) and local start/end (end ≤ start crosses midnight) during which `profile` applies."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="windows")
    name = NameField(max_length=100)
    weekdays = models.JSONField(help_text="Days the window starts on, 0 = Monday … 6 = Sunday.")
    start = models.TimeField()
    end = models.TimeField()
    profile = models.ForeignKey(SharingProfile, on_delete=models.PROTECT, related_name="+")
    qos_policy = models.ForeignKey(
        QoSPolicy,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="schedule_windows",
        help_text="Empty: the pool's default QoS policy during this window.",
    )

    class Meta:
        ordering = ["schedule", "start", "pk"]

    def __str__(self):
        return f"{self.name} {self.start:%H:%M}–{self.end:%H:%M}"


class ScheduleException(models.Model):
    """A date (in the schedule's zone) on which no window starts: holidays keep the baseline."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="exceptions")
    date = models.DateField()
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["date"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "date"], name="%(app_label)s_%(class)s_unique_date"),
        ]

    def __str__(self):
        return f"{self.date} {self.note}"


class KueueBinding(models.Model):
    """A pool's Kueue quota, kept in step with its layout: Tessera owns one ResourceFlavor per GPU product of the
    pool and those flavors' nominalQuota in the named ClusterQueues (scheduling/quota.py, worker/kueue.py)."""

    pool = models.OneToOneField(NodePool, on_delete=models.CASCADE, related_name="kueue")
    enabled = models.BooleanField(default=True)
    cluster_queues = models.JSONField(default=list, help_text="Names of the ClusterQueues whose quota Tessera sets.")
    lead_minutes = models.PositiveIntegerField(
        default=15, help_text="How long before a scheduled transition the quota of vanishing resources is lowered."
    )
    # Written by the sync (worker/kueue.py): per ClusterQueue Tessera does not write (someone else changed a quota
    # Tessera wrote), each changed value as {flavor, resource, live (None: absent), wrote}; and the last error.
    drift = models.JSONField(default=dict, blank=True)
    last_error = models.TextField(blank=True)
    synced_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pool__name"]

    def __str__(self):
        return f"Kueue quota of {self.pool}"
