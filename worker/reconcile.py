"""The level-triggered loop: compare desired with observed for every node, turn differences into rollouts."""

from collections import defaultdict

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet.models import Node, NodePool
from scheduling.selectors import DesiredVsObserved, desired_vs_observed
from sharing import services as sharing_services
from sharing.spec import allocatable
from worker import services
from worker.choices import ACTIVE_CHANGE_STATUSES, RolloutTrigger
from worker.models import NodeChange


def to_config(row: DesiredVsObserved) -> dict:
    """Everything a node change needs to apply and verify, frozen at planning time (JSON)."""
    config, spec = row.config, row.spec
    return {
        "config_id": row.config_id,
        "profile": row.profile.name,
        "mig_config": config.mig_config_name,
        "mig_parted": config.mig_parted_text,
        "device_plugin_config": config.device_plugin_key,
        "device_plugin": config.device_plugin_text,
        "allocatable": allocatable(spec, row.gpus),
        # What an agent applies beyond MIG (it has no device plugin): MPS limits and the time-slice length.
        "sharing": {
            "mode": spec.mode,
            "replicas": spec.replicas,
            "mps_active_thread_percentage": spec.mps_active_thread_percentage,
            "mps_pinned_memory_limit_mib": spec.mps_pinned_memory_limit_mib,
            "time_slice_interval": spec.time_slice_interval,
        },
        "node_settings": row.node_settings,
    }


def reconcilable_nodes(queryset=None):
    """Live, ready nodes whose observations are fresh: stale or not-ready nodes get no new changes."""
    queryset = queryset if queryset is not None else Node.objects.all()
    # Labels are the bulk of a node row and the loop never reads them.
    return queryset.live().fresh().exclude(ready=False).defer("labels")


def plan(nodes, *, at=None) -> dict[tuple, list[services.PlannedChange]]:
    """Drifted nodes without a change in flight, grouped by (pool, profile, source); nodes whose last attempt at
    the same config failed are left for a human (shown as failed) instead of being retried forever."""
    rows = [r for r in desired_vs_observed(nodes, at=at) if r.in_sync is False and r.config is not None]
    busy = set(
        NodeChange.objects.filter(node__in=[r.node.pk for r in rows], status__in=ACTIVE_CHANGE_STATUSES).values_list(
            "node_id", flat=True
        )
    )
    rows = [r for r in rows if r.node.pk not in busy]
    problems = services.nodes_with_problem_for({r.node.pk: r.config.config_id for r in rows})
    pools = NodePool.objects.in_bulk({r.node.pool_id for r in rows} - {None})
    groups = defaultdict(list)
    for row in rows:
        if row.node.pk in problems:
            continue
        key = (pools.get(row.node.pool_id), row.profile, row.source, row.schedule if row.source == "schedule" else None)
        groups[key].append(services.PlannedChange(row.node, to_config(row), row.profile.pk))
    return groups


def reconcile(*, at=None, nodes=None) -> list[int]:
    """One pass of the loop; returns the ids of the rollouts it created. Safe to run concurrently or repeatedly."""
    at = at or timezone.now()
    created = []
    for (pool, profile, source, schedule), planned in plan(reconcilable_nodes(nodes), at=at).items():
        trigger = RolloutTrigger.SCHEDULE if source == "schedule" else RolloutTrigger.RECONCILE
        where = pool.name if pool else "pinned nodes"
        strategy = dict(settings.TESSERA["ROLLOUT_DEFAULTS"])
        if schedule is not None:
            strategy.update(busy_policy=schedule.busy_policy, wait_minutes=schedule.wait_minutes)
        actor = Actor.schedule(schedule.name) if schedule is not None else Actor.system("reconcile")
        try:
            rollout = services.rollout_create(
                actor=actor,
                trigger=trigger,
                title=f"{where} → {profile.name} ({len(planned)} node{'s' if len(planned) != 1 else ''})",
                changes=planned,
                pool=pool,
                profile=profile,
                **strategy,
            )
        except (ApplicationError, IntegrityError):
            continue  # another pass got there first; the next pass sees its changes
        created.append(rollout.pk)
    return created


def rollout_start(*, actor: Actor, nodes, **strategy) -> list[int]:
    """An operator's explicit rollout: bring these nodes to their desired state now, with the given strategy.

    One rollout per (pool, profile) group, like the loop; raises when nothing in scope differs from desired.
    """
    groups = plan(reconcilable_nodes(nodes))
    if not groups:
        skipped = nodes.live().count() - reconcilable_nodes(nodes).count()
        reason = f" ({skipped} stale or not-ready node(s) were left out)" if skipped else ""
        raise ApplicationError(
            "Nothing to roll out: the nodes in scope already run their desired configuration, are changing "
            f"already, or failed on it before and wait for a retry{reason}."
        )
    created = []
    for (pool, profile, _source, _schedule), planned in groups.items():
        where = pool.name if pool else "pinned nodes"
        rollout = services.rollout_create(
            actor=actor,
            trigger=RolloutTrigger.USER,
            title=f"{where} → {profile.name} ({len(planned)} node{'s' if len(planned) != 1 else ''})",
            changes=planned,
            pool=pool,
            profile=profile,
            **strategy,
        )
        created.append(rollout.pk)
    return created


@transaction.atomic
def pool_assign_and_roll_out(*, actor: Actor, pool, profile, strategy: dict | None = None) -> list[int]:
    """Make `profile` the pool's default and, with a strategy, roll it out now — in one transaction, so the
    reconcile pass the assignment triggers finds the nodes already changing instead of racing with defaults."""
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    if strategy is None:
        return []
    return rollout_start(actor=actor, nodes=pool.nodes.all(), **strategy)
