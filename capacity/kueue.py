"""Kueue Workloads as demand of the pools Tessera keeps quota for (issue 20 point 2): the worker reads a cluster's
Workloads (worker/kueue.py) and hands them here as `SeenWorkload`s; each is mapped to a pool with an enabled Kueue
binding in that cluster and recorded through `capacity.sampling.workloads_record`.

A Workload belongs to the pool whose flavor (`tessera-<pool>-<product>`, scheduling/quota.py) its admission assigned;
one not admitted yet, to the pool bound to its ClusterQueue (through its LocalQueue) when exactly one bound pool of
the cluster names that queue. Any other Workload (another flavor, an unbound queue, a queue several pools share) is
left out, with the reason logged.
"""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from capacity.sampling import WorkloadRow, workloads_record
from scheduling.kueue import pool_flavors
from scheduling.models import KueueBinding

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SeenWorkload:
    """What the cluster reader read of one Workload."""

    namespace: str
    name: str
    cluster_queue: str  # its admission's, else its LocalQueue's ("": unknown)
    flavors: frozenset[str]  # the flavors its admission (or quota reservation) assigned
    requests: dict[str, int]  # GPU resource -> units over all its pod sets (count × per-pod requests)
    created_at: datetime | None
    admitted_at: datetime | None  # the Admitted condition's lastTransitionTime while True


def bound_pools(cluster_id: int) -> list[int]:
    """Pools of the cluster whose Kueue binding is enabled: the only ones whose Workloads are read."""
    return list(
        KueueBinding.objects.filter(enabled=True, pool__cluster_id=cluster_id)
        .order_by("pool_id")
        .values_list("pool_id", flat=True)
    )


def workload_rows(cluster_id: int, seen: Iterable[SeenWorkload]) -> list[WorkloadRow]:
    """Each Workload of a bound pool as a `WorkloadRow`; the others are left out (logged)."""
    bindings = list(KueueBinding.objects.filter(enabled=True, pool__cluster_id=cluster_id).select_related("pool"))
    by_flavor = {flavor: b.pool_id for b in bindings for flavor in pool_flavors(b.pool)}
    by_queue: dict[str, set[int]] = {}
    for binding in bindings:
        for queue in binding.cluster_queues:
            by_queue.setdefault(queue, set()).add(binding.pool_id)
    rows = []
    for workload in seen:
        if not workload.requests or workload.created_at is None:
            continue
        pools = {by_flavor[f] for f in workload.flavors if f in by_flavor}
        if not workload.flavors:
            pools = by_queue.get(workload.cluster_queue, set())
        if len(pools) != 1:
            why = (
                f"ClusterQueue {workload.cluster_queue!r} is shared by pools {sorted(pools)}"
                if pools
                else f"neither its flavors {sorted(workload.flavors)} nor its ClusterQueue "
                f"{workload.cluster_queue!r} belong to a bound pool"
            )
            log.info("Workload %s/%s not recorded: %s", workload.namespace, workload.name, why)
            continue
        (pool_id,) = pools
        rows.append(
            WorkloadRow(
                pool_id, workload.namespace, workload.name, workload.requests, workload.created_at, workload.admitted_at
            )
        )
    return rows


def cluster_workloads_record(cluster_id: int, seen: Iterable[SeenWorkload], *, now: datetime | None = None) -> int:
    """Replace the current bucket's Workload demand of the cluster's bound pools with what was read; returns the
    rows written."""
    return workloads_record(workload_rows(cluster_id, seen), pool_ids=bound_pools(cluster_id), now=now)
