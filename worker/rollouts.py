"""Rollouts: create them, start one on an operator's request, steer them (pause, resume, cancel).

Advancing them is the engine's (worker.services); a rollout created or resumed here is handed to it once the
transaction commits, through worker.enqueue.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence

from django.db import transaction
from django.utils import timezone

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from core.models import AuditEvent
from fleet.models import Node
from scheduling.assign import Assignment, AssignMode, pool_assign
from scheduling.selectors import desired_vs_observed
from sharing.models import NodePin
from worker import enqueue, services
from worker.choices import (
    ACTIVE_CHANGE_STATUSES,
    FINISHED_ROLLOUT_STATUSES,
    LIVE_ROLLOUT_STATUSES,
    PROBLEM_STATUSES,
    ChangeStatus,
    RolloutStatus,
    RolloutTrigger,
)
from worker.models import NodeChange, NodeRetry, Rollout
from worker.selectors import PlannedChange, plan, reconcilable_nodes

NOT_STARTED = (ChangeStatus.QUEUED, ChangeStatus.WAITING_FOR_IDLE)


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
    services.rollout_announce(rollout, "started", f"by {actor.label}")
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
    taken = rollouts_supersede(nodes=nodes)
    groups = plan(reconcilable_nodes(nodes))
    if not groups:
        skipped = nodes.live().count() - reconcilable_nodes(nodes).count()
        reason = f" ({skipped} stale or not-ready node(s) were left out)" if skipped else ""
        raise ApplicationError(
            "Nothing to roll out: the nodes in scope already run their desired configuration, are changing "
            f"already, or failed on it and wait for their next try (retry them now on the node page){reason}."
        )
    changes = [change for planned in groups.values() for change in planned]
    pool = _only({pool for pool, *_ in groups})
    profile = _only({profile for _, profile, *_ in groups})
    rollout = rollout_create(
        actor=actor,
        trigger=RolloutTrigger.USER,
        title=rollout_title(pool, profile, len(changes)),
        changes=changes,
        pool=pool,
        profile=profile,
        **strategy,
    )
    rollouts_link_successors(taken, {rollout.pk: {change.node.pk for change in changes}})
    return rollout


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


def _set_rollout_status(
    rollout: Rollout, *, actor: Actor, allowed: Iterable[str], new: str, action: str, **extra
) -> Rollout:
    now = timezone.now()
    finished = now if new in FINISHED_ROLLOUT_STATUSES else None
    moved = Rollout.objects.filter(pk=rollout.pk, status__in=list(allowed)).update(
        status=new, updated_at=now, finished_at=finished, **extra
    )
    if not moved:
        rollout.refresh_from_db()
        raise ApplicationError(f"Rollout #{rollout.pk} is {rollout.status}; it cannot be {action}.", status=409)
    before = rollout.status
    rollout.refresh_from_db()
    audit_record(actor=actor, action=f"rollout.{action}", obj=rollout, before={"status": before}, after={"status": new})
    services.rollout_announce(rollout, new, f"by {actor.label}")
    return rollout


@transaction.atomic
def rollout_pause(*, actor: Actor, rollout: Rollout) -> Rollout:
    """Start no new nodes; nodes already changing finish their step."""
    return _set_rollout_status(
        rollout, actor=actor, allowed=[RolloutStatus.RUNNING], new=RolloutStatus.PAUSED, action="pause"
    )


@transaction.atomic
def rollout_resume(*, actor: Actor, rollout: Rollout) -> Rollout:
    """Carry on; the nodes failed so far are accepted, so only later failures stop or pause the rollout again."""
    failures = rollout.changes.filter(status__in=PROBLEM_STATUSES).count()
    rollout = _set_rollout_status(
        rollout,
        actor=actor,
        allowed=[RolloutStatus.PAUSED],
        new=RolloutStatus.RUNNING,
        action="resume",
        accepted_failures=failures,
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
    pending = rollout.changes.filter(status__in=NOT_STARTED).select_related("node")
    services.node_changes_cancel(list(pending), f"cancelled by {actor.label}")
    return rollout


# --- back-off: a person skips the wait -------------------------------------------------------------------------------


@transaction.atomic
def retry_now(*, actor: Actor, nodes) -> int:
    """End the back-off of these failed (or held) nodes: the loop tries their desired config on the pass this starts.
    The failure count stays, so an automatic retry after another failure still waits longer. Returns how many."""
    now = timezone.now()
    waiting = NodeRetry.objects.select_for_update().filter(node__in=nodes, next_retry_at__gt=now)
    retries = list(waiting.select_related("node"))
    for retry in retries:
        audit_record(
            actor=actor,
            action="node.retry_now",
            obj=retry.node,
            before={"next_retry_at": retry.next_retry_at.isoformat(), "failures": retry.failures},
            after={"next_retry_at": now.isoformat()},
        )
    NodeRetry.objects.filter(pk__in=[r.pk for r in retries]).update(next_retry_at=now, updated_at=now)
    if retries:
        enqueue.reconcile_tick()
    return len(retries)


def rollout_retry_now(*, actor: Actor, rollout: Rollout) -> int:
    """Retry now every node whose back-off this rollout's failure set (failed or held back with it)."""
    return retry_now(actor=actor, nodes=Node.objects.filter(retry__rollout=rollout))


# --- superseding: a newer desired state takes over from a rollout toward an older one -------------------------------


def rollouts_supersede(*, nodes=None, at=None) -> dict[int, set[int]]:
    """Cancel the queued and waiting changes of running or paused rollouts whose config is no longer the one their
    node should get (a pool assignment, a pin, a schedule window or an edited profile came since), and mark a rollout
    `superseded` once none of its nodes is left to start. Nodes mid-apply finish and are verified: MIG Manager or an
    agent interrupted mid-reconfiguration leaves GPUs in an unknown state, and the node, once done, is drifted and
    rolled to the new desired state by the loop. Returns {rollout id: ids of the nodes taken from it}."""
    pending = NodeChange.objects.filter(status__in=NOT_STARTED, rollout__status__in=LIVE_ROLLOUT_STATUSES)
    if nodes is not None:
        pending = pending.filter(node__in=nodes)
    targets = {node_id: config_id for node_id, config_id in pending.values_list("node_id", "to_config__config_id")}
    if not targets:
        return {}
    desired = {row.node.pk: row for row in desired_vs_observed(Node.objects.filter(pk__in=list(targets)), at=at)}
    outdated = {node_id for node_id, config_id in targets.items() if desired[node_id].config_id != config_id}
    by_rollout = defaultdict(list)
    for change in pending.filter(node_id__in=outdated).select_related("node"):
        by_rollout[change.rollout_id].append(change)
    taken = {}
    for rollout_id, changes in by_rollout.items():
        freed = _supersede(rollout_id, changes, desired)
        if freed:
            taken[rollout_id] = freed
    return taken


def _desired_text(row) -> str:
    """What the node should get now and who said so, in words for the event stream."""
    node = row.node
    if row.profile is None:
        where = f"pool {node.pool.name}" if node.pool_id else "the node's pool"
        return f"{node.name}: nothing is desired any more ({where} has no profile now)"
    if row.source == "pin":
        pin = NodePin.objects.filter(node=node).select_related("pinned_by").first()
        by = f" by {pin.pinned_by.get_username()}" if pin and pin.pinned_by else ""
        return f"{node.name} pinned to {row.profile.name}{by}"
    if row.source == "schedule":
        return f"schedule {row.schedule.name} now gives pool {node.pool.name} {row.profile.name}"
    event = (
        AuditEvent.objects.filter(action="pool.set_profile", object_type="nodepool", object_id=str(node.pool_id))
        .order_by("-at", "-pk")
        .first()
    )
    by = f" by {event.actor_label}" if event else ""
    return f"pool {node.pool.name}'s default profile is now {row.profile.name}{by}"


def _superseded_text(change: NodeChange, row) -> str:
    if row.profile is not None and row.profile.name == change.to_config.get("profile"):
        return f"profile {row.profile.name} was changed since the rollout began"
    return _desired_text(row)


@transaction.atomic
def _supersede(rollout_id: int, changes: list[NodeChange], desired: dict) -> set[int]:
    rollout = Rollout.objects.select_for_update().filter(pk=rollout_id, status__in=LIVE_ROLLOUT_STATUSES).first()
    if rollout is None:
        return set()
    texts = sorted({_superseded_text(c, desired[c.node_id]) for c in changes})
    message = "superseded: " + "; ".join(texts[:3]) + (f" and {len(texts) - 3} more" if len(texts) > 3 else "")
    cancelled = services.node_changes_cancel(changes, message)
    if not rollout.changes.filter(status__in=NOT_STARTED).exists():
        before = rollout.status
        now = timezone.now()
        Rollout.objects.filter(pk=rollout.pk).update(status=RolloutStatus.SUPERSEDED, finished_at=now, updated_at=now)
        rollout.status = RolloutStatus.SUPERSEDED
        audit_record(
            actor=Actor.system("reconcile"),
            action="rollout.superseded",
            obj=rollout,
            before={"status": before},
            after={"status": rollout.status},
            message=message,
            now=now,
        )
        services.rollout_announce(rollout, rollout.status, message[:200])
    return {c.node_id for c in cancelled}


def rollouts_link_successors(taken: dict[int, set[int]], created: dict[int, set[int]]) -> None:
    """Name, on each superseded rollout, the new rollout that took over its nodes (the first one, by id)."""
    for old_id, freed in taken.items():
        successor = next((new_id for new_id, nodes in sorted(created.items()) if nodes & freed), None)
        if successor is None:
            continue
        with transaction.atomic():
            old = Rollout.objects.select_for_update().get(pk=old_id)
            old.superseded_by_id = successor
            old.save(update_fields=["superseded_by", "updated_at"])
            audit_record(
                actor=Actor.system("reconcile"),
                action="rollout.superseded_by",
                obj=old,
                after={"rollout": successor},
                message=f"rollout #{successor} took over {len(freed & created[successor])} of its node(s)",
            )
