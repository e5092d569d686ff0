"""Rollouts: create them, start one on an operator's request, steer them (pause, resume, cancel).

Advancing them is the engine's (worker.services); a rollout created or resumed here is handed to it once the
transaction commits, through worker.enqueue.
"""

from collections.abc import Iterable, Sequence

from django.db import transaction
from django.utils import timezone

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.models import Node
from scheduling.assign import Assignment, AssignMode, pool_assign
from worker import enqueue, services
from worker.choices import ACTIVE_CHANGE_STATUSES, ChangeStatus, RolloutStatus, RolloutTrigger
from worker.models import NodeChange, Rollout
from worker.selectors import PlannedChange, plan, reconcilable_nodes


def _from_config(node: Node) -> dict:
    """What the node runs now; only a config the node applied successfully is a rollback target."""
    return {
        "mig_config": node.observed_mig_config or None,
        "device_plugin_config": node.observed_device_plugin_config,
        "mode": node.observed_mode,
        "config_state": node.config_state,
        "allocatable": node.allocatable,
    }


@transaction.atomic
def rollout_create(
    *, actor: Actor, trigger: str, title: str, changes: Sequence[PlannedChange], pool=None, profile=None, **strategy
) -> Rollout:
    """Create a rollout and its queued node changes; refused if a node already has a change in flight."""
    if not changes:
        raise ApplicationError("Nothing to roll out: every node already has its desired configuration.")
    busy = set(
        NodeChange.objects.filter(node__in=[c.node for c in changes], status__in=ACTIVE_CHANGE_STATUSES).values_list(
            "node__name", flat=True
        )
    )
    if busy:
        raise ApplicationError(
            f"{len(busy)} node(s) already have a change in progress: {', '.join(sorted(busy)[:5])}.", status=409
        )
    rollout = Rollout(
        title=title[:300],
        trigger=trigger,
        actor=actor.user if getattr(actor.user, "pk", None) else None,
        actor_label=actor.label,
        pool=pool,
        profile=profile,
        **strategy,
    )
    rollout.full_clean(exclude=["actor", "pool", "profile"])
    rollout.save()
    NodeChange.objects.bulk_create(
        NodeChange(
            rollout=rollout,
            node=planned.node,
            position=position,
            profile_id=planned.profile_id,
            from_config=_from_config(planned.node),
            to_config=planned.to_config,
            applied_mig_config=planned.to_config.get("mig_config") or "",
        )
        for position, planned in enumerate(sorted(changes, key=lambda c: c.node.name))
    )
    audit_record(
        actor=actor,
        action="rollout.create",
        obj=rollout,
        after={"nodes": len(changes), "title": rollout.title, "strategy": strategy},
    )
    enqueue.rollout_advance(rollout.pk)
    return rollout


def rollout_title(pool, profile, nodes: int) -> str:
    """A planned group as lists show it: where, the profile and how many nodes (None: several pools or profiles)."""
    where = pool.name if pool else "pinned nodes"
    what = profile.name if profile else "their desired profiles"
    return f"{where} → {what} ({nodes} node{'s' if nodes != 1 else ''})"


def _only(values: set):
    """The one value of a set, or None when it holds several."""
    return next(iter(values)) if len(values) == 1 else None


def rollout_start(*, actor: Actor, nodes, **strategy) -> Rollout:
    """An operator's explicit rollout: bring these nodes to their desired state now, with the given strategy.

    One rollout for the whole scope (its pool and profile set when all its nodes share them), so a client gets the
    one rollout it asked for; raises when nothing in scope differs from desired.
    """
    groups = plan(reconcilable_nodes(nodes))
    if not groups:
        skipped = nodes.live().count() - reconcilable_nodes(nodes).count()
        reason = f" ({skipped} stale or not-ready node(s) were left out)" if skipped else ""
        raise ApplicationError(
            "Nothing to roll out: the nodes in scope already run their desired configuration, are changing "
            f"already, or failed on it before and wait for a retry{reason}."
        )
    changes = [change for planned in groups.values() for change in planned]
    pool = _only({pool for pool, *_ in groups})
    profile = _only({profile for _, profile, *_ in groups})
    return rollout_create(
        actor=actor,
        trigger=RolloutTrigger.USER,
        title=rollout_title(pool, profile, len(changes)),
        changes=changes,
        pool=pool,
        profile=profile,
        **strategy,
    )


@transaction.atomic
def pool_assign_and_roll_out(
    *, actor: Actor, pool, profile, strategy: dict | None = None, mode: str = AssignMode.DEFAULT
) -> tuple[Assignment, Rollout | None]:
    """Assign `profile` to the pool as `mode` says (scheduling.assign) and, with a strategy, roll it out now — in
    one transaction, so the reconcile pass the assignment triggers (sent on commit) finds the nodes already
    changing instead of racing with its defaults. With a strategy and nothing to roll out, nothing is assigned
    either (as the UI says); rolling out a new default while the pool's schedule sets another profile is refused
    with the schedule's reason (nothing would change until it lets go)."""
    assignment = pool_assign(actor=actor, pool=pool, profile=profile, mode=mode)
    if strategy is None:
        return assignment, None
    if assignment.rule is not None and mode == AssignMode.DEFAULT:
        when = assignment.rule.when(assignment.rule.until)
        message = f"Nothing to roll out now: {assignment.message}"
        if when:
            message += f" To apply it now, change the schedule's profile or pin the nodes until {when}."
        raise ApplicationError(message, errors={"rollout_now": [message]})
    return assignment, rollout_start(actor=actor, nodes=pool.nodes.all(), **strategy)


def _set_rollout_status(rollout: Rollout, *, actor: Actor, allowed: Iterable[str], new: str, action: str) -> Rollout:
    now = timezone.now()
    finished = now if new in (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED) else None
    moved = Rollout.objects.filter(pk=rollout.pk, status__in=list(allowed)).update(
        status=new, updated_at=now, finished_at=finished
    )
    if not moved:
        rollout.refresh_from_db()
        raise ApplicationError(f"Rollout #{rollout.pk} is {rollout.status}; it cannot be {action}.", status=409)
    before = rollout.status
    rollout.refresh_from_db()
    audit_record(actor=actor, action=f"rollout.{action}", obj=rollout, before={"status": before}, after={"status": new})
    return rollout


@transaction.atomic
def rollout_pause(*, actor: Actor, rollout: Rollout) -> Rollout:
    """Start no new nodes; nodes already changing finish their step."""
    return _set_rollout_status(
        rollout, actor=actor, allowed=[RolloutStatus.RUNNING], new=RolloutStatus.PAUSED, action="pause"
    )


@transaction.atomic
def rollout_resume(*, actor: Actor, rollout: Rollout) -> Rollout:
    rollout = _set_rollout_status(
        rollout, actor=actor, allowed=[RolloutStatus.PAUSED], new=RolloutStatus.RUNNING, action="resume"
    )
    enqueue.rollout_advance(rollout.pk)
    return rollout


@transaction.atomic
def rollout_cancel(*, actor: Actor, rollout: Rollout) -> Rollout:
    """Cancel queued and waiting nodes (uncordoning what Tessera cordoned); nodes mid-apply finish and verify."""
    rollout = _set_rollout_status(
        rollout,
        actor=actor,
        allowed=[RolloutStatus.RUNNING, RolloutStatus.PAUSED],
        new=RolloutStatus.CANCELLED,
        action="cancel",
    )
    now = timezone.now()
    waiting = list(rollout.changes.filter(status=ChangeStatus.WAITING_FOR_IDLE, cordoned_by_tessera=True))
    rollout.changes.filter(status__in=[ChangeStatus.QUEUED, ChangeStatus.WAITING_FOR_IDLE]).update(
        status=ChangeStatus.CANCELLED, finished_at=now, updated_at=now, status_since=now, error="cancelled"
    )
    if waiting:
        transaction.on_commit(lambda: services.node_changes_uncordon([c.pk for c in waiting]))
    return rollout
