"""The level-triggered loop: compare desired with observed for every node, turn differences into rollouts.

A pass first supersedes what running rollouts would still start toward a config no longer desired, then reads the
drift and the plan (worker.selectors) and creates one rollout per group; a repeated pass finds the nodes already
changing, or failed and waiting out their back-off, and does nothing new. A full pass also records the drift it
saw (for /metrics).
"""

from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from core.audit import Actor
from core.exceptions import ApplicationError
from worker.choices import RolloutTrigger
from worker.rollouts import rollout_create, rollout_title, rollouts_link_successors, rollouts_supersede
from worker.selectors import drift, plan, reconcilable_nodes
from worker.telemetry import drift_record


def reconcile(*, at=None, nodes=None) -> list[int]:
    """One pass of the loop; returns the ids of the rollouts it created. Safe to run concurrently or repeatedly."""
    at = at or timezone.now()
    created = {}
    taken = rollouts_supersede(nodes=nodes, at=at)  # first: the nodes it frees are planned below
    drifted = drift(reconcilable_nodes(nodes), at=at)
    if nodes is None:
        drift_record(drifted, now=at)
    for (pool, profile, source, schedule), planned in plan(None, drifted=drifted).items():
        trigger = RolloutTrigger.SCHEDULE if source == "schedule" else RolloutTrigger.RECONCILE
        strategy = dict(settings.TESSERA["ROLLOUT_DEFAULTS"])
        if schedule is not None:
            strategy.update(busy_policy=schedule.busy_policy, wait_minutes=schedule.wait_minutes)
        actor = Actor.schedule(schedule.name) if schedule is not None else Actor.system("reconcile")
        try:
            rollout = rollout_create(
                actor=actor,
                trigger=trigger,
                title=rollout_title(pool, profile, len(planned)),
                changes=planned,
                pool=pool,
                profile=profile,
                **strategy,
            )
        except (ApplicationError, IntegrityError):
            continue  # another pass got there first; the next pass sees its changes
        created[rollout.pk] = {p.node.pk for p in planned}
    rollouts_link_successors(taken, created)
    return list(created)
