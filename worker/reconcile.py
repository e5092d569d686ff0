"""The level-triggered loop: compare desired with observed, turn differences into rollouts.

A pass first supersedes what running rollouts would still start toward a config no longer desired, then reads the
drift and the plan (worker.selectors) and creates one rollout per group; a repeated pass finds the nodes already
changing, or failed and waiting out their back-off, and does nothing new.

The tick is incremental: it evaluates only the nodes whose desired or observed state could have changed since the
last evaluation (`tick_scope`): nodes and pools named by marks (worker.marks: an edit of a pool, profile, pin,
schedule or QoS policy, a node's observed config, its GPUs), pools whose schedule crossed a window boundary, pins
that ended, back-offs that ran out, nodes drifted at the last evaluation (their change may have finished) and nodes
back in the loop after being stale or not ready. Every RECONCILE_FULL_SECONDS a full pass (its own task, with a
longer time limit) evaluates every node instead, and counts as missed any drifted node the incremental scope would not
have held (logged, and on /metrics).
"""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet.models import Node
from fleet.querysets import stale_q
from scheduling.selectors import pools_switched
from sharing.models import NodePin
from worker.choices import RolloutTrigger
from worker.models import NodeDrift, NodeRetry, ReconcileMark, ReconcileState
from worker.rollouts import rollout_create, rollout_title, rollouts_link_successors, rollouts_supersede
from worker.selectors import Drift, drift, plan, reconcilable_nodes
from worker.telemetry import drift_record

log = logging.getLogger(__name__)
CHUNK = 5000
FULL_PASS_MAX_SECONDS = 600  # the full pass task's time limit: a request older than this is sent again


@dataclass
class Scope:
    """What one pass evaluates: every node (`full`) or `node_ids`, which an incremental tick would evaluate (also
    computed on a full pass that follows one, to check it); the marks it answers and the nodes out of the loop now."""

    full: bool
    node_ids: set[int] | None
    marks: list[int]
    held: set[int]
    state: ReconcileState | None


def tick_scope(*, at, full: bool | None = None) -> Scope:
    """The nodes this tick must evaluate at `at` (`node_ids` None: only a full pass can say, since none ran yet or a
    mark says everything); a full pass when `full`, or when `full` is None and one is due."""
    state = ReconcileState.objects.filter(pk=1).first()
    marks = list(ReconcileMark.objects.values_list("pk", "node_id", "pool_id", "everything"))
    held = set(Node.objects.live().filter(stale_q() | Q(ready=False)).values_list("pk", flat=True))
    everything = any(m[3] for m in marks)
    node_ids = None if state is None or state.full_at is None or everything else _candidates(state, marks, held, at)
    if full is None:
        full = node_ids is None or _full_due(state, at)
    return Scope(full, node_ids, [m[0] for m in marks], held, state)


def _full_due(state: ReconcileState | None, at) -> bool:
    period = timedelta(seconds=settings.TESSERA["RECONCILE_FULL_SECONDS"])
    return state is None or state.full_at is None or at - state.full_at >= period


def full_pass_request(*, at=None) -> bool:
    """Whether a full pass is due (none yet, its period over, or a mark says everything) and the caller is the one to
    send it (worker.tasks.reconcile_full): a request stands until the pass answers it, or FULL_PASS_MAX_SECONDS."""
    at = at or timezone.now()
    state, _ = ReconcileState.objects.get_or_create(pk=1)
    if not (_full_due(state, at) or ReconcileMark.objects.filter(everything=True).exists()):
        return False
    unanswered = Q(full_requested_at__isnull=True) | Q(
        full_requested_at__lt=at - timedelta(seconds=FULL_PASS_MAX_SECONDS)
    )
    return ReconcileState.objects.filter(unanswered, pk=1).update(full_requested_at=at) == 1


def _candidates(state: ReconcileState, marks, held: set[int], at) -> set[int]:
    since = state.evaluated_at
    nodes = {node_id for _, node_id, _, _ in marks if node_id is not None}
    pools = {pool_id for _, _, pool_id, _ in marks if pool_id is not None} | pools_switched(since, at)
    pools = sorted(pools)
    for i in range(0, len(pools), CHUNK):
        nodes.update(Node.objects.filter(pool_id__in=pools[i : i + CHUNK]).values_list("pk", flat=True))
    earlier, later = sorted([since, at])
    nodes.update(NodePin.objects.filter(until__gt=earlier, until__lte=later).values_list("node_id", flat=True))
    # Back-offs run out: their nodes are drifted anyway, unless a full pass running meanwhile replaced the drift rows.
    retries = NodeRetry.objects.filter(next_retry_at__gt=earlier, next_retry_at__lte=later)
    nodes.update(retries.values_list("node_id", flat=True))
    nodes.update(NodeDrift.objects.values_list("node_id", flat=True))
    nodes.update(set(state.held) - held)  # back in the loop
    return nodes


def evaluate(scope: Scope, *, at) -> Drift:
    """Desired against observed for the scope's nodes that the loop may change (worker.selectors.drift)."""
    if scope.full:
        return drift(reconcilable_nodes(), at=at)
    ids = sorted(scope.node_ids)
    nodes = []
    for i in range(0, len(ids), CHUNK):
        nodes.extend(reconcilable_nodes(Node.objects.filter(pk__in=ids[i : i + CHUNK])))
    return drift(nodes, at=at)


def reconcile(*, at=None, nodes=None, full: bool | None = None) -> list[int]:
    """One pass of the loop; returns the ids of the rollouts it created. Safe to run concurrently or repeatedly.
    `nodes`: only these (a queryset), no drift recorded; else the tick's scope. `full`: True a full pass, False never
    one (the tick: worker.tasks.reconcile_full runs them; until the first, it evaluates nothing), None one when due."""
    at = at or timezone.now()
    created = {}
    taken = rollouts_supersede(nodes=nodes, at=at)  # first: the nodes it frees are planned below
    scope = None
    if nodes is not None:
        drifted = drift(reconcilable_nodes(nodes), at=at)
    else:
        scope = tick_scope(at=at, full=full)
        if not scope.full and scope.node_ids is None:
            return []  # only a full pass can answer: its task is on its way (full_pass_request)
        drifted = evaluate(scope, at=at)
        drift_record(drifted, now=at, scope=None if scope.full else scope.node_ids)
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
    if scope is not None:
        _answered(scope, drifted, at=at)
    return list(created)


def _answered(scope: Scope, drifted: Drift, *, at) -> None:
    """After the pass: its marks are answered, its instant is the next tick's start; a full pass that follows an
    incremental one checks that every node it found drifted was in the incremental scope."""
    missed = set()
    if scope.full and scope.node_ids is not None:
        missed = {row.node.pk for row in drifted.rows} - scope.node_ids
        if missed:
            log.warning(
                "reconcile: the full pass found %d drifted node(s) the incremental tick would not have evaluated: %s",
                len(missed),
                sorted(missed)[:20],
            )
    with transaction.atomic():
        state = ReconcileState.objects.select_for_update().filter(pk=1).first()
        if state is None:
            state = ReconcileState(pk=1)
        state.evaluated_at, state.held = at, sorted(scope.held)
        if scope.full:
            state.full_at, state.full_requested_at = at, None
        if missed:
            state.missed += len(missed)
            state.last_missed_at = at
        state.save()
        for low, high in _runs(scope.marks):  # marks written meanwhile (other ids) stay for the next tick
            ReconcileMark.objects.filter(pk__gte=low, pk__lte=high).delete()


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Consecutive ids as (first, last) ranges: deleting a range removes no row the pass did not read."""
    runs = []
    for pk in sorted(ids):
        if runs and pk == runs[-1][1] + 1:
            runs[-1][1] = pk
        else:
            runs.append([pk, pk])
    return [tuple(r) for r in runs]
