"""Assigning a profile to a pool whose schedule rules now: what the schedule will do and when, and the three things
an admin may mean — change the pool's default (it applies once the schedule leaves the pool to it), change the
schedule's part in force now (the window, or the baseline), or pin the pool's nodes until the next transition."""

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from django.db import models, transaction
from django.utils import timezone

from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role, has_role
from fleet.models import NodePool
from scheduling import services, windows
from scheduling.models import Schedule
from scheduling.selectors import active_schedules
from scheduling.timeline import days_text
from sharing import services as sharing_services
from sharing.models import NodePin, SharingProfile


class AssignMode(models.TextChoices):
    DEFAULT = "default", "Make it the pool's default"
    WINDOW = "window", "Change the profile the schedule sets now"
    PIN = "pin_until_next_transition", "Pin the pool's nodes until the schedule's next transition"


def _when(at: datetime | None, now: datetime, zone: str) -> str:
    """An instant as the schedule's wall clock reads it: 20:00 CET today, Mon 08:00 CET within a week."""
    if at is None:
        return ""
    local, today = at.astimezone(ZoneInfo(zone)), now.astimezone(ZoneInfo(zone)).date()
    if local.date() == today:
        return local.strftime("%H:%M %Z")
    if (local.date() - today).days < 7:
        return local.strftime("%a %H:%M %Z")
    return local.strftime("%Y-%m-%d %H:%M %Z")


@dataclass(frozen=True)
class ScheduleRule:
    """A pool's schedule setting the pool's profile at `at`: which part of it (a window, or the baseline), until
    when, and when the pool's default profile next applies (None: not within the next 8 days)."""

    schedule: Schedule
    profile: SharingProfile
    window: windows.Window | None
    at: datetime
    until: datetime | None
    next_profile: SharingProfile | None  # what the schedule sets from `until` (None: the pool's default)
    default_from: datetime | None
    pinned: int  # the pool's nodes with a pin of their own, which keep it

    @property
    def part(self) -> str:
        if self.window is None:
            return "its baseline"
        name = f"window {self.window.name}" if self.window.name else "a window"
        return f"{name} ({days_text(sorted(self.window.weekdays))} {self.window.start:%H:%M}–{self.window.end:%H:%M})"

    def when(self, instant: datetime | None) -> str:
        return _when(instant, self.at, self.schedule.time_zone)

    @property
    def until_text(self) -> str:
        return self.when(self.until)

    @property
    def default_from_text(self) -> str:
        return self.when(self.default_from)

    @property
    def sets_text(self) -> str:
        """What the schedule sets now and until when (the pool page's "why")."""
        sets = f"The schedule {self.schedule.name} sets {self.profile.name} ({self.part})"
        return sets + (f" until {self.until_text}" if self.until else "")

    @property
    def now_text(self) -> str:
        """The pool page's "why": the schedule's part in force, then what follows it."""
        if self.until is None:
            return f"{self.sets_text}."
        return f"{self.sets_text}; then {self.next_profile.name if self.next_profile else 'the pool default'}."

    @property
    def message(self) -> str:
        """What assigning a profile as the pool's default does while the schedule rules, in one sentence or two."""
        sets = self.sets_text
        if self.default_from is None:
            return (
                f"{sets}; it leaves the pool to its default profile at no time in the next 8 days, so a new default "
                "would not apply: change the schedule's profile or pin the nodes instead."
            )
        if self.default_from == self.until:
            return f"{sets}; your profile applies from then."
        then = f", then {self.next_profile.name}" if self.next_profile else ""
        return f"{sets}{then}; your profile applies from {self.when(self.default_from)}."


def schedule_rule(pool: NodePool, *, at: datetime | None = None) -> ScheduleRule | None:
    """The pool's schedule's hold on its profile at `at`, or None when the pool's default is what applies."""
    at = at or timezone.now()
    schedule = active_schedules([pool.pk]).get(pool.pk)
    if schedule is None:
        return None
    calendar = schedule.calendar
    window = windows.active_window(calendar, at)
    profile_id = (calendar.baseline if window is None else window.value)[0]
    if profile_id is None:
        return None
    until = default_from = next_profile_id = None
    for t in windows.transitions(calendar, at, at + windows.NEXT_TRANSITION_HORIZON):
        to_profile = t.to_value[0]
        if until is None and to_profile != profile_id:
            until, next_profile_id = t.at, to_profile
        if to_profile is None:
            default_from = t.at
            break
    profiles = SharingProfile.objects.in_bulk({profile_id, next_profile_id} - {None})
    return ScheduleRule(
        schedule=schedule,
        profile=profiles[profile_id],
        window=window,
        at=at,
        until=until,
        next_profile=profiles.get(next_profile_id),
        default_from=default_from,
        pinned=NodePin.objects.in_force(at).filter(node__pool=pool, node__gone_at__isnull=True).count(),
    )


@dataclass(frozen=True)
class Assignment:
    """What an assignment did: the mode, the schedule's hold it met (None: none), and a sentence saying when the
    profile applies."""

    mode: str
    rule: ScheduleRule | None
    message: str
    applies_from: datetime | None
    pinned_until: datetime | None = None
    pins: int = 0


def _refuse(mode: str, message: str, status: int = 400) -> None:
    raise ApplicationError(message, errors={"mode": [message]}, status=status)


@transaction.atomic
def pool_assign(
    *, actor: Actor, pool: NodePool, profile: SharingProfile, mode: str = AssignMode.DEFAULT, at=None
) -> Assignment:
    """Assign `profile` to `pool` as `mode` says (AssignMode); the pool's default when no schedule rules it now.

    `window` rewrites the schedule (an admin's move; every week's occurrence of that window, or the baseline) and
    `pin_until_next_transition` pins the pool's live nodes without a pin of their own until the schedule's next
    transition; both are refused when the schedule does not rule the pool now."""
    at = at or timezone.now()
    rule = schedule_rule(pool, at=at)
    if mode == AssignMode.DEFAULT:
        sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
        if rule is None:
            return Assignment(mode, None, f"{profile.name} is now the default profile of pool {pool.name}.", at)
        return Assignment(mode, rule, rule.message, rule.default_from)
    if mode not in AssignMode.values:
        _refuse(mode, f"Unknown mode {mode!r}; one of {', '.join(AssignMode.values)}.")
    if rule is None:
        _refuse(mode, f"No schedule sets pool {pool.name}'s profile now: assign it as the pool's default instead.")
    if mode == AssignMode.WINDOW:
        if not has_role(actor.user, Role.ADMIN):
            _refuse(mode, "Changing a schedule needs the admin role.", status=403)
        _replace_in_force(actor, rule, profile)
        return Assignment(mode, rule, f"{rule.part[0].upper()}{rule.part[1:]} of schedule {rule.schedule.name} "
                          f"now sets {profile.name}, from now on and in every week to come.", at)  # fmt: skip
    if rule.until is None:
        _refuse(mode, f"The schedule {rule.schedule.name} has no transition in the next 8 days to pin until.")
    nodes = list(pool.nodes.live().exclude(pin__in=NodePin.objects.in_force(at)).order_by("name"))
    reason = f"Until schedule {rule.schedule.name}'s next transition ({rule.when(rule.until)})"
    sharing_services.nodes_pin_profile(actor=actor, nodes=nodes, profile=profile, reason=reason, until=rule.until)
    kept = (
        f"; {rule.pinned} node{'s' if rule.pinned != 1 else ''} with a pin of their own keep it" if rule.pinned else ""
    )
    message = (
        f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} of pool {pool.name} pinned to {profile.name} until "
        f"{rule.when(rule.until)}, when the schedule {rule.schedule.name} takes them back{kept}."
    )
    return Assignment(mode, rule, message, at, pinned_until=rule.until, pins=len(nodes))


def _replace_in_force(actor: Actor, rule: ScheduleRule, profile: SharingProfile) -> None:
    """The window in force (or the baseline) of the rule's schedule, set to `profile` through the schedule
    service (validated against the pool's nodes, audited as a schedule update)."""
    schedule = rule.schedule
    if rule.window is None:
        services.schedule_update(actor=actor, schedule=schedule, baseline_profile=profile)
        return
    rows = services.schedule_rows(schedule)
    for row in rows:
        if (frozenset(row["weekdays"]), row["start"], row["end"]) == (
            rule.window.weekdays,
            rule.window.start,
            rule.window.end,
        ):
            row["profile"] = profile
    services.schedule_update(actor=actor, schedule=schedule, windows=rows)
