"""The one answer to "which profile should this node have": its pin, else its pool's schedule, else the pool default."""

import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count
from django.utils import timezone

from core.exceptions import ApplicationError
from fleet.choices import ClusterDriver
from fleet.models import Cluster, Gpu, Node, NodePool
from scheduling import windows
from scheduling.models import Schedule, ScheduleException, ScheduleWindow
from sharing.models import NodePin, PoolSharing, QoSPolicy, SharingProfile
from sharing.qos import check_pods, consistency_errors, flagged_share
from sharing.render import content_name
from sharing.selectors import NodeImpact, pool_pod_views, preview_summary, profile_preview, profiles_under_pool_policy
from sharing.services import kubelet_mismatches
from sharing.spec import (
    NodeConfig,
    ProfileSpec,
    cluster_strategy_problems,
    node_config,
    node_validation_errors,
    under_cluster_strategy,
)


@dataclass(frozen=True)
class DesiredState:
    """A node's desired profile and where it came from ("pin", "schedule", "pool"), or no opinion."""

    profile: SharingProfile | None
    source: str = ""
    schedule: Schedule | None = None  # the pool's schedule, whose safety policy a resulting rollout follows
    qos_policy: QoSPolicy | None = None

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


def pools_switched(start, end) -> set[int]:
    """Pools whose schedule gives another value (profile, QoS policy) at `end` than at `start`: a window began or
    ended in between (DST-correct, scheduling.windows). Only their nodes may want another config for the time alone."""
    if start == end:
        return set()
    return {
        pool_id
        for pool_id, calendar in enabled_calendars().items()
        if windows.value_at(calendar, start) != windows.value_at(calendar, end)
    }


def enabled_calendars() -> dict[int, windows.Calendar]:
    """Every enabled schedule's calendar by pool id (as Schedule.to_calendar builds it), read as tuples: the tick
    reads them all, and model instances with prefetched windows cost ten times more."""
    enabled = Schedule.objects.filter(enabled=True)
    found = defaultdict(list)
    rows = ScheduleWindow.objects.filter(schedule__enabled=True).values_list(
        "schedule_id", "weekdays", "start", "end", "profile_id", "qos_policy_id", "name"
    )
    for schedule_id, weekdays, start, end, profile_id, qos_id, name in rows:
        found[schedule_id].append(windows.Window(frozenset(weekdays), start, end, (profile_id, qos_id), name))
    dates = defaultdict(set)
    for schedule_id, day in ScheduleException.objects.filter(schedule__enabled=True).values_list("schedule_id", "date"):
        dates[schedule_id].add(day)
    values = enabled.values_list("pk", "pool_id", "time_zone", "baseline_profile_id", "baseline_qos_policy_id")
    return {
        pool_id: windows.Calendar(tz, tuple(found[pk]), (profile_id, qos_id), frozenset(dates[pk]))
        for pk, pool_id, tz, profile_id, qos_id in values.order_by()
    }


def pool_states(pool_ids, *, at=None) -> dict[int, DesiredState]:
    """Each pool's desired profile and QoS policy at `at`: the active window's, else the schedule baseline's, else
    the pool's defaults (the profile falls back separately from the QoS policy)."""
    at = at or timezone.now()
    pool_ids = set(pool_ids)
    defaults = {
        s.pool_id: s for s in PoolSharing.objects.filter(pool_id__in=pool_ids).select_related("profile", "qos_policy")
    }
    schedules = active_schedules(pool_ids)
    values = {pool_id: windows.value_at(s.calendar, at) for pool_id, s in schedules.items()}
    profiles = SharingProfile.objects.in_bulk({v[0] for v in values.values()} - {None})
    policies = QoSPolicy.objects.in_bulk({v[1] for v in values.values()} - {None})
    states = {}
    for pool_id in pool_ids:
        default = defaults.get(pool_id)
        profile_id, qos_id = values.get(pool_id, (None, None))
        qos = policies[qos_id] if qos_id is not None else (default.qos_policy if default else None)
        if profile_id is not None:
            states[pool_id] = DesiredState(profiles[profile_id], "schedule", schedules[pool_id], qos)
        elif default and default.profile:
            states[pool_id] = DesiredState(default.profile, "pool", schedules.get(pool_id), qos)
        else:
            states[pool_id] = DesiredState(None, "", schedules.get(pool_id), qos)
    return states


def desired_states(nodes, *, at=None) -> dict[int, DesiredState]:
    """Desired state of many nodes at instant `at` (default now) in a constant number of queries: the node's pin
    for the profile, else its pool's state (`pool_states`); the QoS policy always comes from the pool."""
    at = at or timezone.now()
    nodes = list(nodes)
    node_ids = {n.pk for n in nodes}
    # Pins are exceptions, few by nature: reading them all beats an IN list of every node id. A pin past its
    # `until` no longer counts, whether or not the tick has removed it yet.
    pins = {
        p.node_id: p.profile for p in NodePin.objects.in_force(at).select_related("profile") if p.node_id in node_ids
    }
    by_pool = pool_states({n.pool_id for n in nodes if n.pool_id}, at=at)
    result = {}
    for node in nodes:
        pool_state = by_pool.get(node.pool_id, NO_OPINION)
        if node.pk in pins:
            result[node.pk] = DesiredState(pins[node.pk], "pin", None, pool_state.qos_policy)
        else:
            result[node.pk] = pool_state
    return result


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
    spec: ProfileSpec | None = None  # the profile as the node's cluster runs it (its MIG strategy)
    config: NodeConfig | None = None
    # Agent nodes also get the QoS policy's GPU settings and host tuning, part of what their config id names.
    node_settings: dict | None = None
    config_id: str | None = None
    # A node's QoS policy always comes from its pool or schedule window (a pin changes only its profile).
    qos_policy: QoSPolicy | None = None


def gpu_shapes(node_ids) -> dict[int, tuple[tuple[int, str], ...]]:
    """(index, product) of every live GPU per node, read as plain tuples (no model instances: 80k GPUs per tick)."""
    shapes = defaultdict(list)
    node_ids = list(node_ids)
    for i in range(0, len(node_ids), 5000):
        rows = Gpu.objects.live().filter(node_id__in=node_ids[i : i + 5000]).values_list("node_id", "index", "product")
        for node_id, index, product in rows:
            shapes[node_id].append((index, product))
    return {node_id: tuple(sorted(gpus)) for node_id, gpus in shapes.items()}


def _cluster_facts(nodes) -> dict[int, tuple[str, str, str]]:
    """(name, driver, MIG strategy) of these nodes' clusters; no query when the nodes carry their cluster already."""
    cached = Node._meta.get_field("cluster")
    facts = {
        n.cluster_id: (n.cluster.name, n.cluster.driver, n.cluster.mig_strategy) for n in nodes if cached.is_cached(n)
    }
    missing = {n.cluster_id for n in nodes} - set(facts)
    if missing:
        rows = Cluster.objects.filter(pk__in=missing).values_list("pk", "name", "driver", "mig_strategy")
        facts.update((pk, tuple(rest)) for pk, *rest in rows)
    return facts


def desired_vs_observed(nodes, *, at=None) -> list[DesiredVsObserved]:
    """Desired against observed for each node; configs are rendered once per (profile, GPU shape)."""
    nodes = list(nodes)
    states = desired_states(nodes, at=at)
    shapes = gpu_shapes(n.pk for n in nodes)
    clusters = _cluster_facts(nodes)
    agent_clusters = {pk for pk, (_, driver, _) in clusters.items() if driver == ClusterDriver.AGENT}
    rendered: dict[tuple, tuple[ProfileSpec, NodeConfig | None, tuple[str, ...]]] = {}
    rows = []
    for node in nodes:
        state = states[node.pk]
        spec, config, problems = None, None, ()
        gpus = shapes.get(node.pk, ())
        if state.profile is not None:
            cluster, _, strategy = clusters[node.cluster_id]
            key = (state.profile.pk, state.profile.updated_at, gpus, cluster, strategy)
            if key not in rendered:
                # As the cluster runs it: its ClusterPolicy's MIG strategy decides the resources (contracts §1.2).
                spec = under_cluster_strategy(state.profile.to_spec(), strategy)
                indices = [index for index, _ in gpus]
                errors = (
                    *cluster_strategy_problems(spec, cluster, strategy, indices),
                    *node_validation_errors(spec, gpus),
                )
                rendered[key] = (spec, None if errors else node_config(spec, gpus), errors)
            spec, config, problems = rendered[key]
        in_sync, settings, config_id = None, None, config.config_id if config else None
        if config is not None:
            in_sync = (
                config.mig_config_name in (None, node.observed_mig_config)
                and config.device_plugin_key == node.observed_device_plugin_config
                and node.config_state == "success"
            )
            if node.cluster_id in agent_clusters:
                settings = state.qos_policy.node_settings() if state.qos_policy else None
                if settings and (settings["gpu"] or settings["host"]):
                    config_id = content_name("tessera-", f"{config.config_id}\n{json.dumps(settings, sort_keys=True)}")
                # The agent names what it applied; before its first apply only settings-free configs can match.
                in_sync = in_sync and (node.agent_config_id or config.config_id) == config_id
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
                spec=spec,
                config=config,
                node_settings=settings,
                config_id=config_id,
                qos_policy=state.qos_policy,
            )
        )
    return rows


@dataclass(frozen=True)
class ScheduledTransition:
    """A moment a schedule switches its pool's profile or QoS policy, and how many nodes follow it."""

    schedule: Schedule
    at: object
    local: object
    from_profile: SharingProfile | None
    to_profile: SharingProfile | None
    from_qos: QoSPolicy | None = None
    to_qos: QoSPolicy | None = None
    nodes: int = 0


def schedule_transitions(
    schedule: Schedule, start, end, *, following: int | None = None, defaults: dict | None = None
) -> list[ScheduledTransition]:
    """Transitions of one schedule in (start, end], with the baseline resolved to the pool's defaults. A caller that
    has read them passes the pool's unpinned node count (`unpinned_node_count`) and PoolSharing rows by pool id."""
    if following is None:
        following = unpinned_node_count(schedule.pool_id)
    return _transitions([schedule], start, end, {schedule.pool_id: following}, defaults)


def unpinned_node_count(pool_id: int) -> int:
    """Live nodes of the pool that follow its schedule."""
    return _unpinned_node_counts([pool_id]).get(pool_id, 0)


def _unpinned_node_counts(pool_ids) -> dict[int, int]:
    """Live nodes per pool that follow the pool's schedule (pinned nodes keep their pin)."""
    return dict(
        Node.objects.live()
        .filter(pool_id__in=list(pool_ids), pin__isnull=True)
        .values_list("pool_id")
        .annotate(n=Count("pk"))
        .order_by()  # the nodes' default order joined every node's cluster for nothing
    )


def _loaded(schedules, window_field: str, schedule_field: str) -> dict:
    """The profiles (or policies) the schedules' windows and baselines already hold, by id: a caller that selected
    them (the schedule page) saves their reads."""
    owners = [(w, window_field) for s in schedules for w in s.windows.all()] + [(s, schedule_field) for s in schedules]
    loaded = {}
    for owner, name in owners:
        field = owner._meta.get_field(name)
        if field.is_cached(owner) and getattr(owner, name) is not None:
            loaded[getattr(owner, field.attname)] = getattr(owner, name)
    return loaded


def _transitions(schedules, start, end, node_counts=None, defaults=None) -> list[ScheduledTransition]:
    schedules = list(schedules)
    if defaults is None:
        pool_ids = [s.pool_id for s in schedules]
        defaults = {
            s.pool_id: s
            for s in PoolSharing.objects.filter(pool_id__in=pool_ids).select_related("profile", "qos_policy")
        }
    profile_ids = {w.profile_id for s in schedules for w in s.windows.all()} | {
        s.baseline_profile_id for s in schedules
    }
    qos_ids = {w.qos_policy_id for s in schedules for w in s.windows.all()} | {
        s.baseline_qos_policy_id for s in schedules
    }
    profiles = _loaded(schedules, "profile", "baseline_profile")
    profiles.update(SharingProfile.objects.in_bulk(profile_ids - {None} - profiles.keys()))
    policies = _loaded(schedules, "qos_policy", "baseline_qos_policy")
    policies.update(QoSPolicy.objects.in_bulk(qos_ids - {None} - policies.keys()))
    result = []
    for schedule in schedules:
        default = defaults.get(schedule.pool_id)

        def resolve(value, default=default):
            profile_id, qos_id = value
            profile = profiles[profile_id] if profile_id is not None else (default.profile if default else None)
            qos = policies[qos_id] if qos_id is not None else (default.qos_policy if default else None)
            return profile, qos

        for t in windows.transitions(schedule.to_calendar(), start, end):
            before, after = resolve(t.from_value), resolve(t.to_value)
            if before != after:
                result.append(
                    ScheduledTransition(
                        schedule=schedule,
                        at=t.at,
                        local=t.local,
                        from_profile=before[0],
                        to_profile=after[0],
                        from_qos=before[1],
                        to_qos=after[1],
                        nodes=(node_counts or {}).get(schedule.pool_id, 0),
                    )
                )
    return sorted(result, key=lambda t: (t.at, t.schedule.pk))


def upcoming_transitions(*, hours: int = 48, now=None) -> list[ScheduledTransition]:
    """The fleet's schedule changes in the next `hours`, each with the number of nodes it switches (unpinned)."""
    now = now or timezone.now()
    schedules = list(
        Schedule.objects.filter(enabled=True).select_related("pool").prefetch_related("windows", "exceptions")
    )
    counts = _unpinned_node_counts(s.pool_id for s in schedules)
    return _transitions(schedules, now, now + timedelta(hours=hours), counts)


TRANSITIONS_AROUND_NOW = "scheduling.transitions_around"  # the key /metrics' collectors share it under


def transitions_around(now=None, *, days: int = 8) -> dict[Schedule, tuple]:
    """Every enabled schedule's latest transition that has come due (at or before `now`) and its next one, within
    `days` either side (None where there is none): what /metrics reports and checks for missed transitions."""
    now = now or timezone.now()
    schedules = list(
        Schedule.objects.filter(enabled=True).select_related("pool__cluster").prefetch_related("windows", "exceptions")
    )
    result = {s: (None, None) for s in schedules}
    for t in _transitions(schedules, now - timedelta(days=days), now + timedelta(days=days)):
        last, upcoming = result[t.schedule]
        if t.at <= now:
            result[t.schedule] = (t, upcoming)
        elif upcoming is None:
            result[t.schedule] = (last, t)
    return result


def qos_policy_impact(policy: QoSPolicy, pool: NodePool | None) -> dict | None:
    """What `policy` would meet on `pool`, before it is attached: contradictions with the pool's profiles, the pods
    its rules would flag, kubelets that run other policies, and whether agents enforce its node settings."""
    if pool is None:
        return None
    state = pool_states([pool.pk])[pool.pk]
    default = PoolSharing.objects.filter(pool=pool).only("qos_policy_id").first()
    spec = policy.to_policy_spec()
    profiles = {p.pk: p for p in [*([state.profile] if state.profile else []), *profiles_under_pool_policy(pool)]}
    conflicts = [
        {"profile": profile, "message": message}
        for profile in profiles.values()
        for messages in consistency_errors(spec, profile.mode).values()
        for message in messages
    ]
    pods, gpus, nodes = pool_pod_views(pool)
    try:
        flagged, observed = flagged_share(policy.workload_rules(), pods, gpus)
        violations = check_pods(policy.workload_rules(), pods, gpus)
    except (KeyError, ValueError):  # a taint or QoS class that does not parse: its field already says why
        flagged = observed = None
        violations = []
    return {
        "pool": pool,
        "state": state,
        "conflicts": conflicts,
        "flagged": flagged,
        "observed": observed,
        "violations": violations,
        "mismatches": kubelet_mismatches(policy, nodes),
        "expects_kubelet": bool(policy.topology_manager_policy or policy.cpu_manager_policy),
        "nodes": len(nodes),
        "agent_driven": pool.cluster.driver == ClusterDriver.AGENT,
        "settings": policy.node_settings(),
        "attached": policy.pk is not None and default is not None and default.qos_policy_id == policy.pk,
    }


@dataclass(frozen=True)
class ScheduleChange:
    """What a schedule being saved would do at one moment to its pool's unpinned nodes: at once ("now"), or at its
    next transition. `impacts` are the profile preview's (measured against what the nodes run now)."""

    when: str  # "now" or "transition"
    at: object
    profile: SharingProfile | None
    qos_policy: QoSPolicy | None
    impacts: tuple[NodeImpact, ...] = ()
    refused: str = ""  # the cluster's MIG strategy cannot run the profile at all

    @property
    def changing(self) -> list[NodeImpact]:
        """The nodes it changes or that refuse it."""
        return [i for i in self.impacts if i.changes or i.errors]

    @property
    def summary(self) -> dict:
        return preview_summary(list(self.impacts))


def schedule_impact(schedule: Schedule, window_rows: list[dict], exception_rows: list[dict], *, now=None) -> list:
    """What saving `schedule` (unsaved values; windows and exception dates as the services take them) would do:
    what it makes the pool's unpinned nodes run at once (a preview against what they run now: no change when they
    run it already), and its next transition. Disabled: nothing (the pool keeps its defaults)."""
    if not schedule.enabled:
        return []
    now = now or timezone.now()
    calendar = windows.Calendar(
        tz=schedule.time_zone,
        windows=tuple(
            windows.Window(
                frozenset(r["weekdays"]), r["start"], r["end"], (r["profile"], r.get("qos_policy")), r.get("name", "")
            )
            for r in window_rows
        ),
        baseline=(schedule.baseline_profile, schedule.baseline_qos_policy),
        exceptions=frozenset(r["date"] for r in exception_rows),
    )
    default = PoolSharing.objects.filter(pool=schedule.pool).select_related("profile", "qos_policy").first()

    def resolve(value):
        profile, qos = value
        return profile or (default.profile if default else None), qos or (default.qos_policy if default else None)

    nodes = schedule.pool.nodes.live().filter(pin__isnull=True)
    changes = [_change("now", now, *resolve(windows.value_at(calendar, now)), nodes)]
    upcoming = windows.next_transition(calendar, now)
    if upcoming is not None:
        changes.append(_change("transition", upcoming.at, *resolve(upcoming.to_value), nodes))
    return changes


def pool_impact(pool: NodePool, *, now=None) -> list[ScheduleChange]:
    """What the pool's desired state as saved makes its unpinned nodes do, against what they run now: its enabled
    schedule's impact (at once and at the next transition, `schedule_impact`), else its default profile's at once.
    The impact of a config plan, read inside the plan's transaction."""
    now = now or timezone.now()
    schedule = (
        Schedule.objects.filter(pool=pool, enabled=True)
        .select_related("pool", "baseline_profile", "baseline_qos_policy")
        .prefetch_related("exceptions", "windows__profile", "windows__qos_policy")
        .first()
    )
    if schedule is not None:
        rows = [
            {"name": w.name, "weekdays": w.weekdays, "start": w.start, "end": w.end, "profile": w.profile,
             "qos_policy": w.qos_policy}
            for w in schedule.windows.all()
        ]  # fmt: skip
        return schedule_impact(schedule, rows, [{"date": e.date} for e in schedule.exceptions.all()], now=now)
    default = PoolSharing.objects.filter(pool=pool).select_related("profile", "qos_policy").first()
    profile, qos = (default.profile, default.qos_policy) if default else (None, None)
    return [_change("now", now, profile, qos, pool.nodes.live().filter(pin__isnull=True))]


def _change(when: str, at, profile, qos, nodes) -> ScheduleChange:
    if profile is None:
        return ScheduleChange(when, at, None, qos)
    try:
        impacts = tuple(profile_preview(profile, nodes))
    except ApplicationError as exc:
        return ScheduleChange(when, at, profile, qos, refused=exc.message)
    return ScheduleChange(when, at, profile, qos, impacts)
