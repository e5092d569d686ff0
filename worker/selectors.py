"""Reads of the worker: which nodes drifted and what changing them takes (the plan), and rollout progress.

The plan is shared by the reconcile loop and by an operator's explicit rollout (worker.rollouts.rollout_start).
"""

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, Exists, F, Min, OuterRef, Q, Value
from django.utils import timezone

from fleet.models import Node, NodePool
from fleet.selectors import pending_deadline
from scheduling.selectors import DesiredVsObserved, desired_vs_observed
from sharing.spec import allocatable
from worker.choices import (
    ACTIVE_CHANGE_STATUSES,
    IN_FLIGHT_STATUSES,
    TERMINAL_CHANGE_STATUSES,
    ChangeStatus,
    RolloutStatus,
)
from worker.models import NodeChange, NodeDrift, NodeRetry, Rollout


@dataclass(frozen=True)
class PlannedChange:
    """One node and the configs it should get (built by the reconcile loop or an explicit rollout request)."""

    node: Node
    to_config: dict
    profile_id: int | None = None


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


@dataclass(frozen=True)
class Drift:
    """The nodes whose observed config differs from the desired one, and what stands in the way of each."""

    rows: list[DesiredVsObserved]
    busy: set[int]  # a change is in progress
    backoff: dict[int, NodeRetry]  # the last change to exactly this config failed (or was held): not yet retried
    evaluated: int = 0  # nodes compared, drifted or not

    def reason(self, row: DesiredVsObserved) -> str:
        """Why the node is not in sync yet (worker.models.NodeDrift.Reason)."""
        if row.node.pk in self.busy:
            return "changing"
        if row.config is None:
            return "invalid"
        retry = self.backoff.get(row.node.pk)
        if retry is None:
            return "planned"
        return "held" if retry.held else "failed"


def drift(nodes, *, at=None) -> Drift:
    """Desired against observed for these nodes, keeping the ones that differ with what holds each back."""
    at = at or timezone.now()
    compared = desired_vs_observed(nodes, at=at)
    rows = [r for r in compared if r.in_sync is False]
    ids = [r.node.pk for r in rows]
    busy, unobserved = set(), {}
    for i in range(0, len(ids), 5000):
        chunk = ids[i : i + 5000]
        busy.update(
            NodeChange.objects.filter(node__in=chunk, status__in=ACTIVE_CHANGE_STATUSES).values_list(
                "node_id", flat=True
            )
        )
        # A change to exactly the desired config that succeeded after the node was last observed: the node runs it,
        # but its row does not say so yet (the watcher or the agent records it next). Planned again now, it would
        # change twice.
        succeeded = Q(status=ChangeStatus.SUCCEEDED, finished_at__gt=F("node__last_seen_at"))
        unobserved.update(
            NodeChange.objects.filter(succeeded, node__in=chunk)
            .order_by("pk")  # the latest wins
            .values_list("node_id", "to_config")
        )
    busy |= {r.node.pk for r in rows if r.config and r.node.pk in unobserved and unobserved[r.node.pk] == to_config(r)}
    wanted = {r.node.pk: r.config_id for r in rows if r.config and r.node.pk not in busy}
    return Drift(rows, busy, backoffs(wanted, at=at), len(compared))


def backoffs(config_ids_by_node: dict[int, str], *, at=None) -> dict[int, NodeRetry]:
    """The back-offs still running for these nodes at exactly these configs (the config id a change to the node
    would carry: an agent node's includes its QoS settings)."""
    at = at or timezone.now()
    retries = {}
    ids = list(config_ids_by_node)
    for i in range(0, len(ids), 5000):
        for retry in NodeRetry.objects.filter(node_id__in=ids[i : i + 5000], next_retry_at__gt=at):
            if retry.config_id == config_ids_by_node[retry.node_id]:
                retries[retry.node_id] = retry
    return retries


def plan(nodes, *, at=None, drifted: Drift | None = None) -> dict[tuple, list[PlannedChange]]:
    """Drifted nodes without a change in flight, grouped by (pool, profile, source); nodes whose last attempt at
    the same config failed wait out their back-off (shown as failed, with the next try). `drifted`: the drift of
    `nodes` when the caller has it already."""
    drifted = drifted or drift(nodes, at=at)
    rows = [r for r in drifted.rows if drifted.reason(r) == "planned"]
    pools = NodePool.objects.in_bulk({r.node.pool_id for r in rows} - {None})
    groups = defaultdict(list)
    for row in rows:
        key = (pools.get(row.node.pool_id), row.profile, row.source, row.schedule if row.source == "schedule" else None)
        groups[key].append(PlannedChange(row.node, to_config(row), row.profile.pk))
    return groups


def rollout_progress(rollout: Rollout) -> dict:
    """Counts per status and the share done, for progress bars (from `with_progress()` annotations, else a query).
    `finished` counts every node that ended; `done` and `percent` leave out the cancelled ones, which never ran:
    a rollout cancelled before it started is 0 % done, not 100 %."""
    if hasattr(rollout, f"n_{ChangeStatus.QUEUED}"):
        counts = {s: getattr(rollout, f"n_{s}") for s in ChangeStatus.values if getattr(rollout, f"n_{s}")}
    else:
        counts = dict(rollout.changes.values_list("status").annotate(n=Count("pk")))
    total = sum(counts.values())
    finished = sum(counts.get(s, 0) for s in TERMINAL_CHANGE_STATUSES)
    cancelled = counts.get(ChangeStatus.CANCELLED, 0)
    done = finished - cancelled
    return {
        "total": total,
        "finished": finished,
        "done": done,
        "cancelled": cancelled,
        "counts": counts,
        "percent": round(100 * done / total) if total else 100,
    }


def rollout_retries(rollout: Rollout) -> list[NodeRetry]:
    """The nodes whose back-off this rollout's failure set and that still wait for their next try."""
    return list(NodeRetry.objects.filter(rollout=rollout, next_retry_at__gt=timezone.now()))


def node_retry(row: DesiredVsObserved) -> NodeRetry | None:
    """The back-off the node waits out before the loop tries its desired config again, if any."""
    if row.config_id is None:
        return None
    retry = NodeRetry.objects.filter(node_id=row.node.pk, config_id=row.config_id).select_related("rollout").first()
    return retry if retry is not None and retry.next_retry_at > timezone.now() else None


# --- what needs attention (the overview) ---------------------------------------------------------------------------


def failed_nodes_q() -> Q:
    """Nodes the last reconcile pass saw drifted because their last change to their desired config failed
    (rolled back or not): they report success on their old config, yet they are failed and wait for a retry."""
    return Q(pk__in=NodeDrift.objects.filter(reason=NodeDrift.Reason.FAILED).values("node_id"))


def stuck_nodes_q(now=None) -> Q:
    """Nodes whose change has not moved for longer than the pending deadline: in flight past its own deadline too
    (a wait for idle GPUs has its own), or queued in a running rollout that has nothing in flight (it stopped
    advancing). A long rollout's nodes queued behind a working batch are not stuck."""
    now = now or timezone.now()
    old = Q(status_since__lt=pending_deadline(now))
    in_flight = Q(status__in=IN_FLIGHT_STATUSES) & (Q(deadline__isnull=True) | Q(deadline__lt=now))
    moving = NodeChange.objects.filter(rollout=OuterRef("rollout"), status__in=IN_FLIGHT_STATUSES)
    queued = Q(status=ChangeStatus.QUEUED, rollout__status=RolloutStatus.RUNNING) & ~Exists(moving)
    return Q(pk__in=NodeChange.objects.filter(old & (in_flight | queued)).values("node_id"))


def next_retry_at_subquery():
    """The earliest next try of the nodes waiting out a back-off (failed or held back), as a scalar subquery (the
    overview's totals take it along in their aggregate)."""
    reasons = [NodeDrift.Reason.FAILED, NodeDrift.Reason.HELD]
    waiting = NodeRetry.objects.filter(node__drift__reason__in=reasons).order_by()
    return waiting.annotate(one=Value(1)).values("one").annotate(at=Min("next_retry_at")).values("at")
