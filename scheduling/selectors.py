"""The one answer to "which profile should this node have": its pin, else its pool's schedule, else the pool default."""

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count
from django.utils import timezone

from fleet.models import Gpu, Node
from scheduling import windows
from scheduling.models import Schedule
from sharing.models import NodePin, PoolSharing, SharingProfile
from sharing.spec import NodeConfig, node_config, node_validation_errors


@dataclass(frozen=True)
class DesiredState:
    """A node's desired profile and where it came from ("pin", "schedule", "pool"), or no opinion."""

    profile: SharingProfile | None
    source: str = ""
    schedule: Schedule | None = None  # the pool's schedule, whose safety policy a resulting rollout follows

    @property
    def profile_id(self) -> int | None:
        return self.profile.pk if self.profile else None


NO_OPINION = DesiredState(None)


def active_schedules(pool_ids) -> dict[int, Schedule]:
    """Enabled schedules of these pools with their windows and exceptions, each with its calendar attached."""
    schedules = Schedule.objects.filter(pool_id__in=list(pool_ids), enabled=True).prefetch_related(
        "windows", "exceptions"
    )
    result = {}
    for schedule in schedules:
        schedule.calendar = schedule.to_calendar()
        result[schedule.pool_id] = schedule
    return result


def desired_states(nodes, *, at=None) -> dict[int, DesiredState]:
    """Desired state of many nodes at instant `at` (default now) in a constant number of queries:
    the node's pin, else the window of its pool's schedule active at `at`, else the pool's default."""
    at = at or timezone.now()
    nodes = list(nodes)
    node_ids = {n.pk for n in nodes}
    # Pins are exceptions, few by nature: reading them all beats an IN list of every node id.
    pins = {p.node_id: p.profile for p in NodePin.objects.select_related("profile") if p.node_id in node_ids}
    pool_ids = {n.pool_id for n in nodes if n.pool_id}
    pool_defaults = {
        s.pool_id: s.profile for s in PoolSharing.objects.filter(pool_id__in=pool_ids).select_related("profile")
    }
    schedules = active_schedules(pool_ids)
    scheduled_ids = {windows.value_at(s.calendar, at) for s in schedules.values()} - {None}
    profiles = SharingProfile.objects.in_bulk(scheduled_ids)
    by_pool = {}
    for pool_id in pool_ids:
        schedule = schedules.get(pool_id)
        profile_id = windows.value_at(schedule.calendar, at) if schedule else None
        if profile_id is not None:
            by_pool[pool_id] = DesiredState(profiles[profile_id], "schedule", schedule)
        elif pool_id in pool_defaults:
            by_pool[pool_id] = DesiredState(pool_defaults[pool_id], "pool", schedule)
        else:
            by_pool[pool_id] = NO_OPINION
    return {
        node.pk: DesiredState(pins[node.pk], "pin") if node.pk in pins else by_pool.get(node.pool_id, NO_OPINION)
        for node in nodes
    }


def desired_state(node, *, at=None) -> DesiredState:
    return desired_states([node], at=at)[node.pk]


@dataclass(frozen=True)
class DesiredVsObserved:
    """One node's desired configs beside what it reports; `in_sync` is None when nothing is desired."""

    node: object
    gpus: tuple[tuple[int, str], ...]  # (index, product) of the node's live GPUs
    profile: SharingProfile | None
    source: str
    schedule: Schedule | None
    desired_mig_config: str | None
    desired_device_plugin_config: str | None
    observed_mode: str
    observed_mig_config: str
    observed_device_plugin_config: str
    config_state: str
    in_sync: bool | None
    problems: tuple[str, ...] = ()
    config: NodeConfig | None = None


def gpu_shapes(node_ids) -> dict[int, tuple[tuple[int, str], ...]]:
    """(index, product) of every live GPU per node, read as plain tuples (no model instances: 80k GPUs per tick)."""
    shapes = defaultdict(list)
    node_ids = list(node_ids)
    for i in range(0, len(node_ids), 5000):
        rows = Gpu.objects.live().filter(node_id__in=node_ids[i : i + 5000]).values_list("node_id", "index", "product")
        for node_id, index, product in rows:
            shapes[node_id].append((index, product))
    return {node_id: tuple(sorted(gpus)) for node_id, gpus in shapes.items()}


def desired_vs_observed(nodes, *, at=None) -> list[DesiredVsObserved]:
    """Desired against observed for each node; configs are rendered once per (profile, GPU shape)."""
    nodes = list(nodes)
    states = desired_states(nodes, at=at)
    shapes = gpu_shapes(n.pk for n in nodes)
    rendered: dict[tuple, tuple[NodeConfig | None, tuple[str, ...]]] = {}
    rows = []
    for node in nodes:
        state = states[node.pk]
        config, problems = None, ()
        gpus = shapes.get(node.pk, ())
        if state.profile is not None:
            key = (state.profile.pk, state.profile.updated_at, gpus)
            if key not in rendered:
                spec = state.profile.to_spec()
                errors = tuple(node_validation_errors(spec, gpus))
                rendered[key] = (None if errors else node_config(spec, gpus), errors)
            config, problems = rendered[key]
        in_sync = None
        if config is not None:
            in_sync = (
                config.mig_config_name in (None, node.observed_mig_config)
                and config.device_plugin_key == node.observed_device_plugin_config
                and node.config_state == "success"
            )
        elif state.profile is not None:
            in_sync = False
        rows.append(
            DesiredVsObserved(
                node=node,
                gpus=gpus,
                profile=state.profile,
                source=state.source,
                schedule=state.schedule,
                desired_mig_config=config.mig_config_name if config else None,
                desired_device_plugin_config=config.device_plugin_key if config else None,
                observed_mode=node.observed_mode,
                observed_mig_config=node.observed_mig_config,
                observed_device_plugin_config=node.observed_device_plugin_config,
                config_state=node.config_state,
                in_sync=in_sync,
                problems=problems,
                config=config,
            )
        )
    return rows


@dataclass(frozen=True)
class ScheduledTransition:
    """A moment a schedule switches its pool from one profile to another, and how many nodes follow it."""

    schedule: Schedule
    at: object
    local: object
    from_profile: SharingProfile | None
    to_profile: SharingProfile | None
    nodes: int = 0


def _effective(profile_id, default: SharingProfile | None, profiles: dict) -> SharingProfile | None:
    return profiles.get(profile_id) if profile_id is not None else default


def schedule_transitions(schedule: Schedule, start, end) -> list[ScheduledTransition]:
    """Transitions of one schedule in (start, end], with the baseline resolved to the pool's default profile."""
    return _transitions([schedule], start, end)


def _transitions(schedules, start, end, node_counts=None) -> list[ScheduledTransition]:
    schedules = list(schedules)
    defaults = {
        s.pool_id: s.profile
        for s in PoolSharing.objects.filter(pool_id__in=[s.pool_id for s in schedules]).select_related("profile")
    }
    ids = {w.profile_id for s in schedules for w in s.windows.all()} | {s.baseline_profile_id for s in schedules}
    profiles = SharingProfile.objects.in_bulk(ids - {None})
    result = []
    for schedule in schedules:
        default = defaults.get(schedule.pool_id)
        for t in windows.transitions(schedule.to_calendar(), start, end):
            before = _effective(t.from_value, default, profiles)
            after = _effective(t.to_value, default, profiles)
            if before != after:
                count = (node_counts or {}).get(schedule.pool_id, 0)
                result.append(ScheduledTransition(schedule, t.at, t.local, before, after, count))
    return sorted(result, key=lambda t: (t.at, t.schedule.pk))


def upcoming_transitions(*, hours: int = 48, now=None) -> list[ScheduledTransition]:
    """The fleet's schedule changes in the next `hours`, each with the number of nodes it switches (unpinned)."""
    now = now or timezone.now()
    schedules = Schedule.objects.filter(enabled=True).select_related("pool").prefetch_related("windows", "exceptions")
    counts = dict(
        Node.objects.live()
        .filter(pool__schedule__enabled=True, pin__isnull=True)
        .values_list("pool_id")
        .annotate(n=Count("pk"))
    )
    return _transitions(schedules, now, now + timedelta(hours=hours), counts)
