"""Beat's sample of every pool: what each resource offered and held, who held it (namespace and team), what waited and
how long, and DCGM's utilisation of the pool's slices. One sample per bucket of TESSERA["CAPACITY"]["SAMPLE_MINUTES"]:
sampling a bucket again replaces its rows (idempotent).

Pending pods belong to the pool whose live nodes match their nodeSelector (the pool with most such nodes); a pod
without one belongs to its cluster's only pool, or to the pool with most nodes offering its resource; otherwise it is
not recorded. Kueue Workloads come in through `workloads_record`, from rows a cluster reader already read.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Case, F, FloatField, When
from django.utils import timezone

from capacity.models import DemandSample, DemandSource, UsageSample
from fleet.models import Gpu, MigDevice, Node, PendingPod, Pod
from sharing.mig import get_product
from sharing.mig.catalog import UnknownProductError

WHOLE_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_PREFIX = "nvidia.com/mig-"
STARTED_QUICKLY_S = 300


def sample_seconds() -> int:
    return 60 * settings.TESSERA["CAPACITY"]["SAMPLE_MINUTES"]


def bucket(now: datetime) -> datetime:
    """The start of the sample bucket `now` falls in (buckets are aligned to the epoch)."""
    step = sample_seconds()
    return datetime.fromtimestamp(int(now.timestamp()) // step * step, tz=now.tzinfo)


@dataclass(frozen=True)
class DemandItem:
    """One pod or Workload asking for one resource: pending, or started at `started_at` (None: not yet)."""

    pool_id: int
    resource: str
    units: int
    created_at: datetime | None
    started_at: datetime | None
    pending: bool


@dataclass(frozen=True)
class WorkloadRow:
    """A Kueue Workload as a cluster reader read it, already mapped to the pool its flavor stands for."""

    pool_id: int
    namespace: str
    name: str
    requests: dict  # resource -> units over all its pod sets
    created_at: datetime
    admitted_at: datetime | None  # None: still pending (not admitted)


class _Node:
    """One live pool node: the share of a GPU one unit of each of its resources is."""

    def __init__(self, allocatable: dict, gpus: int, product: str):
        self.shares = {}
        try:
            catalog = get_product(product) if product else None
        except UnknownProductError:
            catalog = None
        for resource, units in allocatable.items():
            if resource in WHOLE_GPU_RESOURCES:
                # Time-slicing and MPS advertise replicas × GPUs: each share is 1/replicas of a GPU.
                self.shares[resource] = min(1.0, gpus / units) if gpus and units else 1.0
            elif resource.startswith(MIG_PREFIX) and catalog is not None:
                profile = next((p for p in catalog.profiles if p.resource_name == resource), None)
                self.shares[resource] = profile.compute_slices / catalog.compute_slices if profile else 1.0


def _nodes() -> dict[int, tuple[int, _Node, dict]]:
    """Live pool nodes: id -> (pool id, shares, allocatable)."""
    rows = Node.objects.live().filter(pool__isnull=False).values("pk", "pool_id", "allocatable")
    gpus = defaultdict(lambda: [0, ""])
    for node_id, product, mig in Gpu.objects.filter(gone_at__isnull=True, node__pool__isnull=False).values_list(
        "node_id", "product", "mig_enabled"
    ):
        gpus[node_id][1] = gpus[node_id][1] or product
        if not mig:
            gpus[node_id][0] += 1
    return {
        row["pk"]: (row["pool_id"], _Node(row["allocatable"] or {}, *gpus[row["pk"]]), row["allocatable"] or {})
        for row in rows
    }


def _pending_pool(pod, nodes_by_cluster: dict[int, list[tuple[dict, int, dict]]], cache: dict) -> int | None:
    key = (pod.cluster_id, tuple(sorted(pod.node_selector.items())), tuple(sorted(pod.gpu_resources)))
    if key in cache:
        return cache[key]
    members = nodes_by_cluster.get(pod.cluster_id, [])
    counts: dict[int, int] = defaultdict(int)
    if pod.node_selector:
        for labels, pool_id, _ in members:
            if all(labels.get(k) == v for k, v in pod.node_selector.items()):
                counts[pool_id] += 1
    elif len({pool_id for _, pool_id, _ in members}) == 1:
        counts[members[0][1]] = 1
    else:
        for _, pool_id, allocatable in members:
            if any(allocatable.get(r) for r in pod.gpu_resources):
                counts[pool_id] += 1
    cache[key] = max(counts, key=lambda p: (counts[p], -p)) if counts else None
    return cache[key]


def _demand_rows(items: Iterable[DemandItem], *, at: datetime, seconds: int, source: str) -> dict:
    """Waiting, arrived and started per (pool, resource): arrivals were created in [at − seconds, at), starts
    happened then."""
    since = at - timedelta(seconds=seconds)
    rows: dict[tuple[int, str], DemandSample] = {}
    for item in items:
        row = rows.get((item.pool_id, item.resource))
        if row is None:
            row = rows[(item.pool_id, item.resource)] = DemandSample(
                pool_id=item.pool_id, at=at, seconds=seconds, source=source, resource=item.resource
            )
        if item.pending:
            row.pending += 1
            row.pending_units += item.units
            if item.created_at:
                row.pending_wait_max_s = max(row.pending_wait_max_s, int((at - item.created_at).total_seconds()))
        if item.created_at and since <= item.created_at < at:
            row.arrived += 1
            row.arrived_units += item.units
        if item.started_at and since <= item.started_at < at:
            waited = max(0.0, (item.started_at - item.created_at).total_seconds()) if item.created_at else 0.0
            row.started += 1
            row.started_within_5min += waited <= STARTED_QUICKLY_S
            row.started_wait_s += waited
    return rows


def _utilisation() -> dict[tuple[int, str], tuple[float | None, float | None]]:
    """DCGM's last utilisation and memory in use, averaged per pool over its slices of each profile (and whole
    GPUs under nvidia.com/gpu)."""
    memory_pct = Case(
        When(memory_mib__gt=0, then=100.0 * F("memory_used_mib") / F("memory_mib")), output_field=FloatField()
    )
    found = {}
    slices = (
        MigDevice.objects.filter(gpu__gone_at__isnull=True, gpu__node__pool__isnull=False)
        .values("gpu__node__pool_id", "profile")
        .annotate(util=Avg("utilization_pct"), memory=Avg(memory_pct))
        .order_by()
    )
    for row in slices:
        resource = MIG_PREFIX + row["profile"].replace("+", ".")
        found[(row["gpu__node__pool_id"], resource)] = (row["util"], row["memory"])
    whole = (
        Gpu.objects.filter(gone_at__isnull=True, mig_enabled=False, node__pool__isnull=False)
        .values("node__pool_id")
        .annotate(util=Avg("utilization_pct"), memory=Avg(memory_pct))
        .order_by()
    )
    for row in whole:
        found[(row["node__pool_id"], WHOLE_GPU_RESOURCES[0])] = (row["util"], row["memory"])
    return found


def sample_record(*, now: datetime | None = None) -> int:
    """Sample every pool into the bucket `now` falls in, replacing that bucket's pod rows; returns the rows written."""
    now = now or timezone.now()
    at, seconds = bucket(now), sample_seconds()
    team_label = settings.TESSERA["CAPACITY"]["TEAM_LABEL"]
    nodes = _nodes()
    capacity: dict[tuple[int, str], int] = defaultdict(int)
    for pool_id, _, allocatable in nodes.values():
        for resource, units in allocatable.items():
            capacity[(pool_id, resource)] += int(units)

    usage: dict[tuple[int, str, str, str], list] = defaultdict(lambda: [0, 0.0])
    used: dict[tuple[int, str], list] = defaultdict(lambda: [0, 0.0])
    items: list[DemandItem] = []
    pods = Pod.objects.filter(node_id__in=list(nodes)).values_list(
        "node_id", "namespace", "labels", "gpu_resources", "created_at", "scheduled_at"
    )
    for node_id, namespace, labels, resources, created, scheduled in pods.iterator(chunk_size=2000):
        pool_id, node, _ = nodes[node_id]
        team = str((labels or {}).get(team_label, ""))[:63]
        for resource, units in (resources or {}).items():
            gpus = units * node.shares.get(resource, 1.0)
            usage[(pool_id, namespace, team, resource)][0] += units
            usage[(pool_id, namespace, team, resource)][1] += gpus
            used[(pool_id, resource)][0] += units
            used[(pool_id, resource)][1] += gpus
            items.append(DemandItem(pool_id, resource, units, created, scheduled, pending=False))

    members = defaultdict(list)
    for node in Node.objects.live().filter(pool__isnull=False).values("cluster_id", "labels", "pool_id", "allocatable"):
        members[node["cluster_id"]].append((node["labels"] or {}, node["pool_id"], node["allocatable"] or {}))
    cache: dict = {}
    for pod in PendingPod.objects.all().iterator(chunk_size=2000):
        pool_id = _pending_pool(pod, members, cache)
        if pool_id is not None:
            for resource, units in pod.gpu_resources.items():
                items.append(DemandItem(pool_id, resource, units, pod.created_at, None, pending=True))

    rows = _demand_rows(items, at=at, seconds=seconds, source=DemandSource.PODS)
    shares = {(pool_id, r): s for pool_id, node, _ in nodes.values() for r, s in node.shares.items()}
    utilisation = _utilisation()
    for key in set(capacity) | set(used) | set(utilisation):
        rows.setdefault(key, DemandSample(pool_id=key[0], at=at, seconds=seconds, resource=key[1]))
    for key, (util, memory) in utilisation.items():
        rows[key].utilization_pct, rows[key].memory_used_pct = util, memory
    for key, row in rows.items():
        row.capacity = capacity.get(key, 0)
        row.used, row.used_gpus = used.get(key, (0, 0.0))
        row.gpu_share = shares.get(key, 1.0)

    with transaction.atomic():
        DemandSample.objects.filter(at=at, source=DemandSource.PODS).delete()
        UsageSample.objects.filter(at=at).delete()
        DemandSample.objects.bulk_create(rows.values(), batch_size=1000)
        UsageSample.objects.bulk_create(
            [
                UsageSample(
                    pool_id=pool_id, at=at, seconds=seconds, namespace=ns, team=team, resource=resource, units=u, gpus=g
                )
                for (pool_id, ns, team, resource), (u, g) in usage.items()
            ],
            batch_size=1000,
        )
    return len(rows) + len(usage)


def workloads_record(
    rows: Iterable[WorkloadRow], *, pool_ids: Iterable[int] | None = None, now: datetime | None = None
) -> int:
    """Record Kueue Workloads as demand of their pools in the bucket `now` falls in (source `workloads`), replacing
    that bucket's Workload rows of `pool_ids` (None: of every pool): pending (not admitted) ones wait, admitted ones
    started at their admission. Takes the complete listing a cluster reader made of those pools (one cluster read
    per call: a cluster that could not be read keeps its rows); returns the rows written."""
    now = now or timezone.now()
    at, seconds = bucket(now), sample_seconds()
    items = [
        DemandItem(row.pool_id, resource, int(units), row.created_at, row.admitted_at, pending=row.admitted_at is None)
        for row in rows
        for resource, units in row.requests.items()
        if units
    ]
    samples = _demand_rows(items, at=at, seconds=seconds, source=DemandSource.WORKLOADS)
    with transaction.atomic():
        stale = DemandSample.objects.filter(at=at, source=DemandSource.WORKLOADS)
        if pool_ids is not None:
            stale = stale.filter(pool_id__in=list(pool_ids))
        stale.delete()
        DemandSample.objects.bulk_create(samples.values(), batch_size=1000)
    return len(samples)
