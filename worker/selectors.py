"""Reads of the worker: which nodes drifted and what changing them takes (the plan), and rollout progress.

The plan is shared by the reconcile loop and by an operator's explicit rollout (worker.rollouts.rollout_start).
"""

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, F

from fleet.models import Node, NodePool
from scheduling.selectors import DesiredVsObserved, desired_vs_observed
from sharing.spec import allocatable
from worker.choices import ACTIVE_CHANGE_STATUSES, PROBLEM_STATUSES, TERMINAL_CHANGE_STATUSES, ChangeStatus
from worker.models import NodeChange, Rollout


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
    failed: set[int]  # the last change to exactly this config failed: left for a person

    def reason(self, row: DesiredVsObserved) -> str:
        """Why the node is not in sync yet (worker.models.NodeDrift.Reason)."""
        if row.node.pk in self.busy:
            return "changing"
        if row.config is None:
            return "invalid"
        return "failed" if row.node.pk in self.failed else "planned"


def drift(nodes, *, at=None) -> Drift:
    """Desired against observed for these nodes, keeping the ones that differ with what holds each back."""
    rows = [r for r in desired_vs_observed(nodes, at=at) if r.in_sync is False]
    ids = [r.node.pk for r in rows]
    busy = set(
        NodeChange.objects.filter(node__in=ids, status__in=ACTIVE_CHANGE_STATUSES).values_list("node_id", flat=True)
    )
    # A change to exactly the desired config that succeeded after the node was last observed: the node runs it, but
    # its row does not say so yet (the watcher or the agent records it next). Planned again now, it would change twice.
    unobserved = dict(
        NodeChange.objects.filter(node__in=ids, status=ChangeStatus.SUCCEEDED, finished_at__gt=F("node__last_seen_at"))
        .order_by("pk")  # the latest wins
        .values_list("node_id", "to_config")
    )
    busy |= {r.node.pk for r in rows if r.config and r.node.pk in unobserved and unobserved[r.node.pk] == to_config(r)}
    failed = nodes_with_problem_for({r.node.pk: r.config.config_id for r in rows if r.config and r.node.pk not in busy})
    return Drift(rows, busy, failed)


def plan(nodes, *, at=None, drifted: Drift | None = None) -> dict[tuple, list[PlannedChange]]:
    """Drifted nodes without a change in flight, grouped by (pool, profile, source); nodes whose last attempt at
    the same config failed are left for a person (shown as failed) instead of being retried forever. `drifted`: the
    drift of `nodes` when the caller has it already."""
    drifted = drifted or drift(nodes, at=at)
    rows = [r for r in drifted.rows if drifted.reason(r) == "planned"]
    pools = NodePool.objects.in_bulk({r.node.pool_id for r in rows} - {None})
    groups = defaultdict(list)
    for row in rows:
        key = (pools.get(row.node.pool_id), row.profile, row.source, row.schedule if row.source == "schedule" else None)
        groups[key].append(PlannedChange(row.node, to_config(row), row.profile.pk))
    return groups


def rollout_progress(rollout: Rollout) -> dict:
    """Counts per status and the share done, for progress bars (from `with_progress()` annotations, else a query)."""
    if hasattr(rollout, f"n_{ChangeStatus.QUEUED}"):
        counts = {s: getattr(rollout, f"n_{s}") for s in ChangeStatus.values if getattr(rollout, f"n_{s}")}
    else:
        counts = dict(rollout.changes.values_list("status").annotate(n=Count("pk")))
    total = sum(counts.values())
    finished = sum(counts.get(s, 0) for s in TERMINAL_CHANGE_STATUSES)
    return {
        "total": total,
        "finished": finished,
        "counts": counts,
        "percent": round(100 * finished / total) if total else 100,
    }


def nodes_with_problem_for(config_ids_by_node: dict[int, str]) -> set[int]:
    """Nodes whose latest change to exactly this config failed: the loop waits for a human instead of retrying."""
    latest = {}
    for node_id, status, config_id in (
        NodeChange.objects.filter(node_id__in=list(config_ids_by_node))
        .order_by("node_id", "-pk")
        .values_list("node_id", "status", "to_config__config_id")
    ):
        latest.setdefault(node_id, (status, config_id))
    return {
        node_id
        for node_id, (status, config_id) in latest.items()
        if status in PROBLEM_STATUSES and config_id == config_ids_by_node[node_id]
    }
