"""Writes of schedules: validated as a whole (windows, zone, overlaps, profiles fitting the pool), audited."""

from contextlib import contextmanager
from datetime import time

from django.core.exceptions import ValidationError
from django.db import transaction

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.models import NodePool
from scheduling import windows
from scheduling.models import Schedule, ScheduleException, ScheduleWindow
from scheduling.selectors import ScheduleChange, pool_states, schedule_impact
from sharing.qos import consistency_errors
from sharing.selectors import refuse_under_cluster_strategies
from sharing.services import nodes_validation_errors, qos_compliance_record, refuse_off_board
from sharing.signals import desired_state_changed

SCHEDULE_FIELDS = (
    "name",
    "time_zone",
    "baseline_profile",
    "baseline_qos_policy",
    "busy_policy",
    "wait_minutes",
    "enabled",
)


def schedule_snapshot(schedule: Schedule) -> dict:
    """The whole schedule as JSON, for audit before/after."""
    return {
        "name": schedule.name,
        "time_zone": schedule.time_zone,
        "baseline_profile": schedule.baseline_profile.name if schedule.baseline_profile else None,
        "baseline_qos_policy": schedule.baseline_qos_policy.name if schedule.baseline_qos_policy else None,
        "busy_policy": schedule.busy_policy,
        "wait_minutes": schedule.wait_minutes,
        "enabled": schedule.enabled,
        "windows": [
            {
                "name": w.name,
                "weekdays": w.weekdays,
                "start": f"{w.start:%H:%M}",
                "end": f"{w.end:%H:%M}",
                "profile": w.profile.name,
                "qos_policy": w.qos_policy.name if w.qos_policy else None,
            }
            for w in schedule.windows.select_related("profile", "qos_policy")
        ],
        "exceptions": [str(e.date) for e in schedule.exceptions.all()],
    }


def _check(schedule: Schedule, window_rows: list[dict], exception_rows: list[dict]) -> None:
    errors: dict[str, list[str]] = {}
    try:
        schedule.full_clean(exclude=["pool"])
    except ValidationError as exc:
        errors.update(exc.message_dict)
    for i, row in enumerate(window_rows):
        days = row.get("weekdays") or []
        if not days or any(not isinstance(d, int) or not 0 <= d <= 6 for d in days):
            errors.setdefault(f"windows[{i}].weekdays", []).append(
                "Pick at least one weekday (0 = Monday … 6 = Sunday)."
            )
    if errors:
        raise ApplicationError("The schedule is not valid.", errors=errors)
    calendar = windows.Calendar(
        tz=schedule.time_zone,
        windows=tuple(
            windows.Window(frozenset(r["weekdays"]), r["start"], r["end"], r["profile"].pk, r.get("name", ""))
            for r in window_rows
        ),
        baseline=schedule.baseline_profile_id,
        exceptions=frozenset(r["date"] for r in exception_rows),
    )
    problems = windows.validate(calendar)
    if problems:
        raise ApplicationError(problems[0], errors={"windows": problems})
    pool = NodePool.objects.filter(pk=schedule.pool.pk)
    for i, row in enumerate(window_rows):
        policy = row.get("qos_policy")
        clashes = consistency_errors(policy.to_policy_spec(), row["profile"].mode) if policy else {}
        if clashes:
            messages = [m for ms in clashes.values() for m in ms]
            raise ApplicationError(
                f"Window {row.get('name') or i + 1}: {messages[0]}", errors={f"windows[{i}].qos_policy": messages}
            )
        if policy:
            refuse_off_board(policy, pool, field=f"windows[{i}].qos_policy")
    if schedule.baseline_qos_policy:
        refuse_off_board(schedule.baseline_qos_policy, pool, field="baseline_qos_policy")
    nodes = schedule.pool.nodes.live()
    # Each profile with the field that names it, so a refusal lands beside that field.
    named = {schedule.baseline_profile: "baseline_profile"} if schedule.baseline_profile else {}
    for i, row in enumerate(window_rows):
        named.setdefault(row["profile"], f"windows[{i}].profile")
    for profile, field in named.items():
        try:
            refuse_under_cluster_strategies(profile, nodes, (schedule.pool.cluster,))
        except ApplicationError as exc:
            raise ApplicationError(exc.message, errors={field: exc.errors.get("profile", [exc.message])}) from exc
        misfits = nodes_validation_errors(profile.to_spec(), nodes)
        if misfits:
            count = len({name for name, _ in misfits})
            raise ApplicationError(
                f"{profile.name} does not fit {count} node(s) of pool {schedule.pool.name}.",
                errors={field: [f"{profile.name}: {name}: {msg}" for name, msg in misfits[:5]]},
            )


def _replace_rows(schedule: Schedule, window_rows, exception_rows) -> None:
    schedule.windows.all().delete()
    ScheduleWindow.objects.bulk_create(ScheduleWindow(schedule=schedule, **row) for row in window_rows)
    schedule.exceptions.all().delete()
    ScheduleException.objects.bulk_create(ScheduleException(schedule=schedule, **row) for row in exception_rows)


def _new(pool: NodePool, windows, exceptions, values) -> tuple[Schedule, list[dict], list[dict]]:
    """A new schedule for `pool` and its rows, checked; nothing written."""
    if Schedule.objects.filter(pool=pool).exists():
        raise ApplicationError(f"Pool {pool.name} already has a schedule; edit it instead.", status=409)
    schedule = Schedule(pool=pool, **{k: v for k, v in values.items() if k in SCHEDULE_FIELDS})
    window_rows, exception_rows = list(windows), list(exceptions)
    _check(schedule, window_rows, exception_rows)
    return schedule, window_rows, exception_rows


def _changed(schedule: Schedule, windows, exceptions, values, *, lock: bool) -> tuple[Schedule, list, list]:
    """The schedule with `values` applied and its rows (given ones replace the stored ones), checked; not saved."""
    schedule = (Schedule.objects.select_for_update() if lock else Schedule.objects).get(pk=schedule.pk)
    for key in SCHEDULE_FIELDS:
        if key in values:
            setattr(schedule, key, values[key])
    window_rows = list(windows) if windows is not None else schedule_rows(schedule)
    exception_rows = (
        list(exceptions)
        if exceptions is not None
        else [{"date": e.date, "note": e.note} for e in schedule.exceptions.all()]
    )
    _check(schedule, window_rows, exception_rows)
    return schedule, window_rows, exception_rows


@transaction.atomic
def schedule_create(*, actor: Actor, pool: NodePool, windows: list[dict], exceptions=(), **values) -> Schedule:
    """Give a pool its schedule; from the next reconcile its nodes follow the window active at that moment."""
    schedule, window_rows, exception_rows = _new(pool, windows, exceptions, values)
    schedule.save()
    _replace_rows(schedule, window_rows, exception_rows)
    audit_record(actor=actor, action="schedule.create", obj=schedule, after=schedule_snapshot(schedule))
    desired_state_changed.send(sender=Schedule)
    return schedule


def schedule_create_preview(*, pool: NodePool, windows: list[dict], exceptions=(), **values) -> list[ScheduleChange]:
    """What schedule_create would do to the pool (checked the same way), writing nothing: the dry run."""
    return schedule_impact(*_new(pool, windows, exceptions, values))


@transaction.atomic
def schedule_update(*, actor: Actor, schedule: Schedule, windows=None, exceptions=None, **values) -> Schedule:
    """Change a schedule; windows and exceptions, when given, replace the old ones as a whole."""
    before = schedule_snapshot(schedule)
    schedule, window_rows, exception_rows = _changed(schedule, windows, exceptions, values, lock=True)
    schedule.save()
    _replace_rows(schedule, window_rows, exception_rows)
    after = schedule_snapshot(schedule)
    if after != before:
        audit_record(actor=actor, action="schedule.update", obj=schedule, before=before, after=after)
        desired_state_changed.send(sender=Schedule)
    return schedule


def schedule_update_preview(*, schedule: Schedule, windows=None, exceptions=None, **values) -> list[ScheduleChange]:
    """What schedule_update would do to the pool (checked the same way), writing nothing: the dry run."""
    return schedule_impact(*_changed(schedule, windows, exceptions, values, lock=False))


def schedule_rows(schedule: Schedule) -> list[dict]:
    """The schedule's windows as the rows schedule_create and schedule_update take."""
    return [
        {
            "name": w.name,
            "weekdays": w.weekdays,
            "start": w.start,
            "end": w.end,
            "profile": w.profile,
            "qos_policy": w.qos_policy,
        }
        for w in schedule.windows.select_related("profile", "qos_policy")
    ]


@transaction.atomic
def schedule_delete(*, actor: Actor, schedule: Schedule) -> None:
    """The pool goes back to its default profile."""
    audit_record(actor=actor, action="schedule.delete", obj=schedule, before=schedule_snapshot(schedule))
    schedule.delete()
    desired_state_changed.send(sender=Schedule)


def day_night_values(
    *,
    pool: NodePool,
    day_profile,
    night_profile,
    time_zone: str,
    day_qos_policy=None,
    night_qos_policy=None,
    day_start: time = time(8),
    day_end: time = time(20),
    weekdays=(0, 1, 2, 3, 4),
    **values,
) -> dict:
    """The day/night preset as schedule_create's arguments: `day_profile` (and `day_qos_policy`) in working hours on
    weekdays, the night pair otherwise — a plain schedule with one window. No QoS policy: the pool's own."""
    return {
        "pool": pool,
        "name": values.pop("name", f"{pool.name} day/night"),
        "time_zone": time_zone,
        "baseline_profile": night_profile,
        "baseline_qos_policy": night_qos_policy,
        "windows": [
            {
                "name": "day",
                "weekdays": list(weekdays),
                "start": day_start,
                "end": day_end,
                "profile": day_profile,
                "qos_policy": day_qos_policy,
            }
        ],
        **values,
    }


# The keys of the one schedule the preset makes → the preset's own fields, so refusals name what was typed.
DAY_NIGHT_FIELDS = {
    "baseline_profile": "night_profile",
    "baseline_qos_policy": "night_qos_policy",
    "windows[0].profile": "day_profile",
    "windows[0].qos_policy": "day_qos_policy",
    "windows[0].weekdays": "weekdays",
    "windows[0].start": "day_start",
    "windows[0].end": "day_end",
    "windows": "day_start",
}


@contextmanager
def _as_preset_fields():
    try:
        yield
    except ApplicationError as exc:
        errors = {}
        for key, messages in exc.errors.items():
            errors.setdefault(DAY_NIGHT_FIELDS.get(key, key), []).extend(messages)
        raise ApplicationError(exc.message, errors=errors, status=exc.status) from exc


def schedule_create_day_night(*, actor: Actor, **preset) -> Schedule:
    """Create the day/night preset (day_night_values), editable afterwards like any schedule."""
    with _as_preset_fields():
        return schedule_create(actor=actor, **day_night_values(**preset))


def schedule_create_day_night_preview(**preset) -> list[ScheduleChange]:
    """What creating the day/night preset would do, writing nothing."""
    with _as_preset_fields():
        return schedule_create_preview(**day_night_values(**preset))


def pool_compliance_check(pool_id: int) -> int:
    """Check one pool's pods against the QoS policy in force now (schedule window, baseline or pool default) and
    record the report; the number of violations, 0 for a pool that is gone."""
    pool = NodePool.objects.filter(pk=pool_id).first()
    if pool is None:
        return 0
    policy = pool_states([pool_id])[pool_id].qos_policy
    return qos_compliance_record(pool=pool, policy=policy).violation_count
