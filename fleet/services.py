"""Writes to the fleet: cluster and pool management, and idempotent recording of what nodes report."""

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet import enqueue
from fleet.choices import ClusterMigStrategy, ConnectionState
from fleet.cluster_access import cluster_access_errors
from fleet.health import gpu_health
from fleet.labels import common_labels, labels_text, parse_selector, selector_matches
from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool, PendingPod, Pod
from fleet.observations import (
    GpuMetrics,
    MigDeviceObservation,
    NodeObservation,
    PendingPodObservation,
    PodObservation,
)

CHUNK = 900  # stays below SQLite's bound-parameter limit with room for other parameters
MEMBERS_AUDITED = 50  # names of nodes that joined or left a pool, per audit event
OVERLAP_NODES_NAMED = 10  # shared nodes named in an overlap message

NODE_FIELDS = (
    "labels",
    "ready",
    "unschedulable",
    "allocatable",
    "kubelet_version",
    "driver_version",
    "cuda_version",
    "numa_nodes",
    "observed_mode",
    "observed_mig_config",
    "observed_device_plugin_config",
    "config_state",
    "last_error",
)
GPU_FIELDS = (
    "index",
    "product",
    "memory_mib",
    "pci_bus_id",
    "pci_device_id",
    "numa_node",
    "mig_capable",
    "mig_enabled",
    "mig_pending",
    "health",
)
MIG_FIELDS = tuple(f.name for f in fields(MigDeviceObservation))


def _chunks(items: Sequence, size: int = CHUNK):
    for i in range(0, len(items), size):
        yield items[i : i + size]


# --- clusters and pools ------------------------------------------------------------------------------------------


CLUSTER_EDITABLE = (
    "name",
    "description",
    "driver",
    "kubeconfig_path",
    "in_cluster",
    "operator_namespace",
    "metrics_url",
    "prometheus_url",
)
POOL_EDITABLE = ("name", "description", "node_selector")


def _save_validated(instance, update_fields=None):
    instance.full_clean()
    instance.save(update_fields=update_fields)
    return instance


def cluster_snapshot(cluster: Cluster) -> dict:
    """The cluster's editable fields for the audit log; the kubeconfig path only as a fingerprint (never shown)."""
    values = {key: getattr(cluster, key) for key in CLUSTER_EDITABLE}
    if values["kubeconfig_path"]:
        values["kubeconfig_path"] = "set, sha256 " + hashlib.sha256(values["kubeconfig_path"].encode()).hexdigest()[:8]
    return values


def pool_snapshot(pool: NodePool) -> dict:
    return {"cluster": pool.cluster.name, **{key: getattr(pool, key) for key in POOL_EDITABLE}}


def _check_access(cluster: Cluster) -> None:
    """Refuse settings that would make the worker read a file or fetch a URL beyond what settings allow."""
    errors = cluster_access_errors(
        kubeconfig_path=cluster.kubeconfig_path, metrics_url=cluster.metrics_url, prometheus_url=cluster.prometheus_url
    )
    if errors:
        raise ApplicationError(next(iter(errors.values()))[0], errors=errors)


@transaction.atomic
def cluster_create(*, actor: Actor, **values) -> Cluster:
    """Register a cluster; the credentials reference is validated, never echoed back."""
    cluster = Cluster(**{k: v for k, v in values.items() if k in CLUSTER_EDITABLE})
    _check_access(cluster)
    _save_validated(cluster)
    audit_record(actor=actor, action="cluster.create", obj=cluster, after=cluster_snapshot(cluster))
    return cluster


@transaction.atomic
def cluster_update(*, actor: Actor, cluster: Cluster, **values) -> Cluster:
    cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
    before = cluster_snapshot(cluster)
    for key in CLUSTER_EDITABLE:
        if key in values:
            setattr(cluster, key, values[key])
    _check_access(cluster)
    _save_validated(cluster)
    after = cluster_snapshot(cluster)
    if after != before:
        audit_record(actor=actor, action="cluster.update", obj=cluster, before=before, after=after)
    return cluster


def cluster_record_contact(
    cluster: Cluster, error: str | None = None, *, reached: bool | None = None, now=None
) -> bool:
    """Record how talking to a cluster went: `error` None is healthy; an error text (shown as is in the UI) marks
    it failing. `reached` (default: no error) says the API answered, which moves `last_contact_at` even when a
    health check fails. `last_error_at` is when the cluster started failing, so the page can say "since …".

    One update of the changed fields that leaves `updated_at` alone (drivers cache their API client by it);
    returns whether anything was written.
    """
    now = now or timezone.now()
    reached = error is None if reached is None else reached
    current = Cluster.objects.filter(pk=cluster.pk).values("connection_state", "last_error").first()
    if current is None:
        return False
    values = {}
    if reached:
        values["last_contact_at"] = now
    if error is None:
        if current["connection_state"] != ConnectionState.OK or current["last_error"]:
            values.update(connection_state=ConnectionState.OK, last_error="")
    else:
        error = error[:2000]
        if current["connection_state"] != ConnectionState.ERROR:
            values.update(connection_state=ConnectionState.ERROR, last_error=error, last_error_at=now)
        elif current["last_error"] != error:
            values["last_error"] = error
    if not values:
        return False
    Cluster.objects.filter(pk=cluster.pk).update(**values)
    for key, value in values.items():
        setattr(cluster, key, value)
    return True


def cluster_record_policy(cluster: Cluster, *, mig_strategy: str, device_plugin_version: str, now=None) -> None:
    """Record what the cluster's ClusterPolicy says at each health check: the MIG strategy the device plugin runs
    under (an unknown value is kept as not set) and its version. One update, `updated_at` left alone."""
    values = {
        "mig_strategy": mig_strategy if mig_strategy in ClusterMigStrategy.values else ClusterMigStrategy.NOT_SET,
        "device_plugin_version": device_plugin_version[:100],
        "cluster_policy_read_at": now or timezone.now(),
    }
    Cluster.objects.filter(pk=cluster.pk).update(**values)
    for key, value in values.items():
        setattr(cluster, key, value)


@transaction.atomic
def cluster_delete(*, actor: Actor, cluster: Cluster) -> None:
    """Refuse while nodes remain: their history would go with them."""
    count = cluster.nodes.count()
    if count:
        raise ApplicationError(f"Cluster {cluster.name} still has {count} nodes; remove them first.", status=409)
    audit_record(actor=actor, action="cluster.delete", obj=cluster, before=cluster_snapshot(cluster))
    cluster.delete()


def _validate_selector(selector: str) -> None:
    try:
        parse_selector(selector)
    except ValueError as exc:
        raise ApplicationError("Invalid node selector.", errors={"node_selector": [str(exc)]}) from exc


@dataclass(frozen=True)
class PoolOverlap:
    """Another pool of the cluster a selector would contend with: the live nodes both would select now, and, when
    none does yet, the labels a node would need for both to select it (fleet.labels.common_labels)."""

    pool: NodePool
    nodes: tuple[str, ...]
    witness: dict | None = None

    @property
    def message(self) -> str:
        if self.nodes:
            named = ", ".join(self.nodes[:OVERLAP_NODES_NAMED])
            more = len(self.nodes) - OVERLAP_NODES_NAMED
            return (
                f"Overlaps pool {self.pool.name}: both would select {len(self.nodes)} node"
                f"{'s' if len(self.nodes) != 1 else ''}: {named}{f' and {more} more' if more > 0 else ''}."
            )
        return (
            f"Overlaps pool {self.pool.name} (selector {self.pool.node_selector}): no node is in both today, but a "
            f"node labelled {labels_text(self.witness)} would be; make the selectors exclude each other."
        )


def pool_overlaps(*, cluster: Cluster, node_selector: str, exclude: NodePool | None = None) -> list[PoolOverlap]:
    """The pools of `cluster` a pool with `node_selector` would share nodes with, sorted by name.

    The rule (docs/architecture.md#pools-do-not-share-nodes): a selector overlaps a selector pool when a live node
    matches both, or when some node could (the two selectors do not exclude each other on any key); it overlaps a
    pool of explicit members when it matches one of them. An empty selector (explicit members) overlaps nothing
    here. Raises ValueError for a selector that does not parse."""
    requirements = parse_selector(node_selector)
    if not requirements:
        return []
    others = NodePool.objects.filter(cluster=cluster).order_by("name")
    if exclude is not None:
        others = others.exclude(pk=exclude.pk)
    others = {pool.pk: (pool, parse_selector(pool.node_selector)) for pool in others}
    if not others:
        return []
    shared: dict[int, list[str]] = {pk: [] for pk in others}
    nodes = _narrowed(Node.objects.live().filter(cluster=cluster), requirements)
    nodes = nodes.order_by("name").values_list("name", "labels", "pool_id")
    for name, labels, pool_id in nodes.iterator(chunk_size=2000):
        if not selector_matches(requirements, labels):
            continue
        for pk, (_pool, theirs) in others.items():
            if selector_matches(theirs, labels) if theirs else pool_id == pk:
                shared[pk].append(name)
    overlaps = []
    for pk, (pool, theirs) in others.items():
        witness = common_labels(requirements, theirs)
        if shared[pk] or witness is not None:
            overlaps.append(PoolOverlap(pool, tuple(shared[pk]), witness))
    return overlaps


def _narrowed(nodes, requirements, also: Q | None = None):
    """`nodes` less those the selector cannot match, by its first `key in (…)` term (`key=value` is one) in SQL, and
    those `also` keeps: reading every node of the cluster for each pool made creating many pools quadratic (bench
    B8). The selector still decides on each node read."""
    for requirement in requirements:
        if requirement.operator == "in" and "__" not in requirement.key:
            matching = Q(**{f"labels__{requirement.key}__in": sorted(requirement.values)})
            return nodes.filter(matching | also if also is not None else matching)
    return nodes


def _refuse_overlaps(*, cluster: Cluster, node_selector: str, exclude: NodePool | None = None) -> None:
    overlaps = pool_overlaps(cluster=cluster, node_selector=node_selector, exclude=exclude)
    if overlaps:
        messages = [o.message for o in overlaps]
        raise ApplicationError(messages[0], errors={"node_selector": messages})


@transaction.atomic
def pool_create(*, actor: Actor, cluster: Cluster, **values) -> NodePool:
    """Create a pool; with a node selector, the cluster's matching nodes join once the worker has run. Refused when
    the selector overlaps another pool's (pool_overlaps): a node belongs to one pool."""
    _validate_selector(values.get("node_selector", ""))
    Cluster.objects.select_for_update().filter(pk=cluster.pk).exists()  # one pool write per cluster at a time
    _refuse_overlaps(cluster=cluster, node_selector=values.get("node_selector", ""))
    pool = _save_validated(NodePool(cluster=cluster, **{k: v for k, v in values.items() if k in POOL_EDITABLE}))
    audit_record(actor=actor, action="pool.create", obj=pool, after=pool_snapshot(pool))
    _enqueue_selector(pool)
    return pool


@transaction.atomic
def pool_update(*, actor: Actor, pool: NodePool, **values) -> NodePool:
    """Change a pool; a new selector is refused when it overlaps another pool's."""
    if "node_selector" in values:
        _validate_selector(values["node_selector"])
    Cluster.objects.select_for_update().filter(pk=pool.cluster_id).exists()
    pool = NodePool.objects.select_for_update().select_related("cluster").get(pk=pool.pk)
    before = pool_snapshot(pool)
    if values.get("node_selector", pool.node_selector) != pool.node_selector:
        _refuse_overlaps(cluster=pool.cluster, node_selector=values["node_selector"], exclude=pool)
    for key in POOL_EDITABLE:
        if key in values:
            setattr(pool, key, values[key])
    _save_validated(pool)
    after = pool_snapshot(pool)
    if after != before:
        audit_record(actor=actor, action="pool.update", obj=pool, before=before, after=after)
    _enqueue_selector(pool)
    return pool


def _enqueue_selector(pool: NodePool) -> None:
    if pool.node_selector:
        enqueue.pool_apply_selector(pool.pk)


@transaction.atomic
def pool_delete(*, actor: Actor, pool: NodePool) -> None:
    """Members fall back to no pool; nothing else is lost."""
    audit_record(
        actor=actor,
        action="pool.delete",
        obj=pool,
        before={**pool_snapshot(pool), "members": pool.nodes.count()},
    )
    pool.delete()


def _audit_members(*, actor: Actor, pool: NodePool, before: set[str], after: set[str], action: str) -> None:
    """One event per membership change: the counts, and the names that joined and left (the first 50 of each)."""
    if before == after:
        return
    audit_record(
        actor=actor,
        action=action,
        obj=pool,
        before={"members": len(before)},
        after={
            "members": len(after),
            "joined": sorted(after - before)[:MEMBERS_AUDITED],
            "left": sorted(before - after)[:MEMBERS_AUDITED],
        },
    )


def _member_names(pool: NodePool) -> set[str]:
    return set(Node.objects.filter(pool=pool).values_list("name", flat=True))


@transaction.atomic
def pool_set_members(*, actor: Actor, pool: NodePool, nodes: Iterable[Node]) -> int:
    """Make exactly these nodes the pool's members; only for pools without a selector, nodes of the same cluster."""
    if pool.node_selector:
        raise ApplicationError(
            "This pool selects its members by label; edit the selector instead.",
            errors={"nodes": ["Members of a selector pool cannot be set explicitly."]},
        )
    nodes = list(nodes)
    foreign = [n.name for n in nodes if n.cluster_id != pool.cluster_id]
    if foreign:
        raise ApplicationError(
            "Nodes must belong to the pool's cluster.",
            errors={"nodes": [f"{', '.join(foreign[:5])} not in cluster {pool.cluster.name}"]},
        )
    before = _member_names(pool)
    ids = [n.pk for n in nodes]
    Node.objects.filter(pool=pool).exclude(pk__in=ids).update(pool=None, updated_at=timezone.now())
    count = Node.objects.filter(pk__in=ids).update(pool=pool, updated_at=timezone.now())
    _audit_members(actor=actor, pool=pool, before=before, after=_member_names(pool), action="pool.set_members")
    return count


@transaction.atomic
def pool_apply_selector(*, pool: NodePool) -> int:
    """Re-evaluate a selector pool's membership against the labels its cluster's nodes reported (a node another,
    older selector pool also matches stays there); who joined and left is audited as the selector's doing (the
    selector change itself is audited by pool_update)."""
    selector_pools = _selector_pools(pool.cluster_id)
    before = _member_names(pool)
    member_ids, leaving_ids = [], []
    nodes = Node.objects.live().filter(cluster=pool.cluster_id)
    nodes = _narrowed(nodes, parse_selector(pool.node_selector), also=Q(pool=pool))
    for pk, labels, pool_id in nodes.values_list("pk", "labels", "pool"):
        # As inventory_record decides it, so the two never pass a node back and forth between overlapping pools.
        if _pool_for(labels, selector_pools, pool_id) == pool.pk:
            member_ids.append(pk)
        elif pool_id == pool.pk:
            leaving_ids.append(pk)
    now = timezone.now()
    for chunk in _chunks(leaving_ids):
        Node.objects.filter(pk__in=chunk).update(pool=None, updated_at=now)
    for chunk in _chunks(member_ids):
        Node.objects.filter(pk__in=chunk).update(pool=pool, updated_at=now)
    after = _member_names(pool)
    _audit_members(actor=Actor.system("pool selector"), pool=pool, before=before, after=after, action="pool.members")
    return len(member_ids)


# --- observed inventory ------------------------------------------------------------------------------------------


@dataclass
class InventoryResult:
    """What a recording changed; all zeros when the same report arrives twice."""

    nodes_created: int = 0
    nodes_updated: int = 0
    nodes_gone: int = 0
    gpus_created: int = 0
    gpus_updated: int = 0
    gpus_gone: int = 0
    mig_devices_replaced: int = 0

    @property
    def changed(self) -> bool:
        return any(astuple(self))


def _selector_pools(cluster):
    pools = NodePool.objects.filter(cluster=cluster).exclude(node_selector="").order_by("pk")
    return [(pool.pk, parse_selector(pool.node_selector)) for pool in pools]


def _pool_for(labels: dict, selector_pools, current_pool_id):
    """The first selector pool whose selector matches; explicit membership is kept when none does."""
    for pool_id, requirements in selector_pools:
        if selector_matches(requirements, labels):
            return pool_id
    if current_pool_id is not None and any(pid == current_pool_id for pid, _ in selector_pools):
        return None  # left its selector pool
    return current_pool_id


@transaction.atomic
def inventory_record(
    *, cluster: Cluster, nodes: Sequence[NodeObservation], complete: bool = False, move_live_gpus: bool = True, now=None
) -> InventoryResult:
    """Record observed nodes idempotently, in bulk; with `complete`, nodes not reported are marked gone. Without
    `move_live_gpus` (a node agent speaks for its own node only) a GPU live on another live node is never moved
    here: storing it fails on its unique UUID (IntegrityError) instead."""
    now = now or timezone.now()
    result = InventoryResult()
    observed = {o.name: o for o in nodes}
    if complete:
        existing = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    else:
        existing = {}
        for chunk in _chunks(list(observed)):
            existing.update({n.name: n for n in Node.objects.filter(cluster=cluster, name__in=chunk)})
    selector_pools = _selector_pools(cluster)

    to_create, to_update, update_fields, seen_ids = [], [], set(), []
    for name, obs in observed.items():
        node = existing.get(name)
        values = {f: getattr(obs, f) for f in NODE_FIELDS}
        if obs.host_settings is not None:  # only agents read host tuning; other sources leave it
            values["host_settings"] = obs.host_settings
        if obs.gpu_stack is not None:  # only a full Kubernetes sync reads it; node watch events leave it
            values["gpu_stack"], values["dynamic_mig"] = obs.gpu_stack, obs.dynamic_mig
        if node is None:
            node = Node(cluster=cluster, name=name, last_seen_at=now, config_state_since=now, **values)
            node.pool_id = _pool_for(obs.labels, selector_pools, None)
            to_create.append(node)
            continue
        seen_ids.append(node.pk)
        changed = {f for f, v in values.items() if getattr(node, f) != v}
        pool_id = _pool_for(obs.labels, selector_pools, node.pool_id)
        if pool_id != node.pool_id:
            changed.add("pool")
        if node.gone_at is not None:
            changed.add("gone_at")
            node.gone_at = None
        if changed:
            for f in changed & set(values):
                setattr(node, f, values[f])
            node.pool_id = pool_id
            if "config_state" in changed:
                node.config_state_since = now
                changed.add("config_state_since")
            node.updated_at = now
            to_update.append(node)
            update_fields |= changed | {"updated_at"}
    if to_create:
        Node.objects.bulk_create(to_create, batch_size=500)
        result.nodes_created = len(to_create)
    if to_update:
        Node.objects.bulk_update(to_update, sorted(update_fields), batch_size=500)
        result.nodes_updated = len(to_update)
    for chunk in _chunks(seen_ids):
        Node.objects.filter(pk__in=chunk).update(last_seen_at=now)
    if complete:
        gone_ids = [n.pk for name, n in existing.items() if name not in observed and n.gone_at is None]
        for chunk in _chunks(gone_ids):
            Node.objects.filter(pk__in=chunk).update(gone_at=now, updated_at=now)
            # A gone node's GPUs are gone with it (kept, like the node, for their history).
            Gpu.objects.filter(node_id__in=chunk, gone_at__isnull=True).update(gone_at=now, updated_at=now)
        result.nodes_gone = len(gone_ids)

    node_ids = {n.name: n.pk for n in [*to_create, *existing.values()]}
    with_gpus = [(node_ids[o.name], o) for o in observed.values() if o.gpus is not None]
    if with_gpus:
        _record_gpus(with_gpus, now, result, move_live_gpus=move_live_gpus)
    return result


def _record_gpus(
    with_gpus: list[tuple[int, NodeObservation]], now, result: InventoryResult, *, move_live_gpus: bool
) -> None:
    node_ids = [node_id for node_id, _ in with_gpus]
    uuids = [g.uuid for _, o in with_gpus for g in o.gpus]
    existing: dict[str, Gpu] = {}
    for chunk in _chunks(node_ids):
        existing.update({g.uuid: g for g in Gpu.objects.filter(node_id__in=chunk, gone_at__isnull=True)})
    # GPUs not live on these nodes: new ones, or ones that moved or came back (kept when gone, so found by UUID).
    for chunk in _chunks([u for u in uuids if u not in existing]):
        elsewhere = Gpu.objects.filter(uuid__in=chunk)
        if not move_live_gpus:
            elsewhere = elsewhere.exclude(gone_at__isnull=True, node__gone_at__isnull=True)
        existing.update({g.uuid: g for g in elsewhere})

    observed_uuids = set(uuids)
    gone = [g for g in existing.values() if g.gone_at is None and g.uuid not in observed_uuids]
    for chunk in _chunks([g.pk for g in gone]):
        Gpu.objects.filter(pk__in=chunk).update(gone_at=now, updated_at=now)
    result.gpus_gone = len(gone)

    to_create, to_update, update_fields, mig_reports = [], [], set(), []
    for node_id, obs in with_gpus:
        for g in obs.gpus:
            values = {f: getattr(g, f) for f in GPU_FIELDS}
            if g.settings is not None:  # only agents read GPU settings; other sources leave them
                values["settings"] = g.settings
            if g.dra_device is not None:  # only ResourceSlices name DRA devices; other sources leave it
                values["dra_device"] = g.dra_device
            gpu = existing.get(g.uuid)
            if gpu is None:
                gpu = Gpu(node_id=node_id, uuid=g.uuid, **values)
                to_create.append(gpu)
            else:
                changed = {f for f, v in values.items() if getattr(gpu, f) != v}
                if gpu.node_id != node_id:
                    gpu.node_id = node_id
                    changed.add("node")
                if gpu.gone_at is not None:
                    gpu.gone_at = None
                    changed.add("gone_at")
                if changed:
                    for f in changed & set(values):
                        setattr(gpu, f, values[f])
                    gpu.updated_at = now
                    to_update.append(gpu)
                    update_fields |= changed | {"updated_at"}
            if g.mig_devices is not None:
                mig_reports.append((gpu, g.mig_devices))
    if to_update:
        Gpu.objects.bulk_update(to_update, sorted(update_fields), batch_size=500)
        result.gpus_updated = len(to_update)
    if to_create:
        Gpu.objects.bulk_create(to_create, batch_size=500)
        result.gpus_created = len(to_create)
    if mig_reports:
        result.mig_devices_replaced = _record_mig_devices(mig_reports)


def _record_mig_devices(reports: list[tuple[Gpu, tuple[MigDeviceObservation, ...]]]) -> int:
    """Replace a GPU's MIG devices only when the reported set differs from what is stored."""
    gpu_ids = [gpu.pk for gpu, _ in reports]
    stored: dict[int, set] = {pk: set() for pk in gpu_ids}
    for chunk in _chunks(gpu_ids):
        for row in MigDevice.objects.filter(gpu_id__in=chunk).values_list("gpu_id", *MIG_FIELDS):
            stored[row[0]].add(row[1:])
    replace_ids, new_rows = [], []
    for gpu, devices in reports:
        wanted = {astuple(d) for d in devices}
        if wanted != stored[gpu.pk]:
            replace_ids.append(gpu.pk)
            new_rows.extend(MigDevice(gpu_id=gpu.pk, **{f: getattr(d, f) for f in MIG_FIELDS}) for d in devices)
    for chunk in _chunks(replace_ids):
        MigDevice.objects.filter(gpu_id__in=chunk).delete()
    MigDevice.objects.bulk_create(new_rows, batch_size=500)
    return len(replace_ids)


@transaction.atomic
def gpu_metrics_record(*, samples: Sequence[GpuMetrics], now=None) -> int:
    """Store the latest utilisation and health sample per GPU (joined by UUID), and its MIG devices' utilisation and
    memory (joined by GPU instance id); returns GPUs updated.

    One executemany of a plain UPDATE per sample: Django's bulk_update builds CASE expressions that cost ~2 ms a
    GPU, far too slow for a 70,000-GPU scrape every 30 s (bench b_sync).
    """
    now = now or timezone.now()
    by_uuid = {s.uuid: s for s in samples}
    rows = []
    for chunk in _chunks(list(by_uuid)):
        rows.extend(
            Gpu.objects.filter(uuid__in=chunk).values_list("pk", "uuid", "last_xid", "last_xid_at", *METRIC_FIELDS)
        )
    params, slices = [], []
    for pk, uuid, last_xid, last_xid_at, *current in rows:
        s = by_uuid[uuid]
        values = dict(zip(METRIC_FIELDS, current, strict=True))
        values.update((f, new) for f in METRIC_FIELDS if (new := getattr(s, f)) is not None)
        if s.last_xid is not None and s.last_xid != last_xid:
            last_xid, last_xid_at = (s.last_xid or None), (now if s.last_xid else last_xid_at)
        health = gpu_health(
            last_xid=last_xid,
            ecc_dbe_total=values["ecc_dbe_total"],
            row_remap_failure=values["row_remap_failure"],
            row_remap_pending=values["row_remap_pending"],
        )
        values["health_signals"] = _HEALTH_SIGNALS_FIELD.get_db_prep_save(values["health_signals"], connection)
        params.append([*values.values(), last_xid, last_xid_at, health, now, pk])
        slices.extend([d.utilization_pct, d.memory_used_mib, pk, d.gpu_instance_id] for d in s.mig_devices)
    columns = [*METRIC_FIELDS, "last_xid", "last_xid_at", "health", "metrics_at"]
    with connection.cursor() as cursor:
        cursor.executemany(_update_sql(Gpu, columns, ["id"]), [_adapt_datetimes(p) for p in params])
        if slices:
            mig_sql = _update_sql(MigDevice, ["utilization_pct", "memory_used_mib"], ["gpu_id", "gpu_instance_id"])
            cursor.executemany(mig_sql, slices)
    return len(params)


METRIC_FIELDS = (
    "utilization_pct",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "ecc_dbe_total",
    "ecc_sbe_total",
    "row_remap_failure",
    "row_remap_pending",
    "uncorrectable_remapped_rows",
    "correctable_remapped_rows",
    "health_signals",
)
_HEALTH_SIGNALS_FIELD = Gpu._meta.get_field("health_signals")


def _update_sql(model, columns: Sequence[str], keys: Sequence[str]) -> str:
    quote = connection.ops.quote_name
    return "UPDATE {} SET {} WHERE {}".format(
        quote(model._meta.db_table),
        ", ".join(f"{quote(c)} = %s" for c in columns),
        " AND ".join(f"{quote(k)} = %s" for k in keys),
    )


def _adapt_datetimes(row: list) -> list:
    """Datetimes as the backend stores them (SQLite keeps text; PostgreSQL takes aware datetimes)."""
    return [connection.ops.adapt_datetimefield_value(v) if isinstance(v, datetime) else v for v in row]


POD_FIELDS = ("namespace", "name", "phase", "qos_class", "priority_class", "owner_kind", "owner_name",
              "gpu_resources", "spec", "labels", "created_at", "scheduled_at")  # fmt: skip


@transaction.atomic
def pods_record(*, cluster: Cluster, pods_by_node: dict[str, Sequence[PodObservation]], now=None) -> int:
    """Replace the observed GPU pods of the given nodes (idempotent; unchanged pods are not rewritten)."""
    now = now or timezone.now()
    node_ids = dict(Node.objects.filter(cluster=cluster, name__in=list(pods_by_node)).values_list("name", "pk"))
    stored = {p.uid: p for p in Pod.objects.filter(node_id__in=list(node_ids.values()))}
    keep, to_create, to_update = set(), [], []
    for node_name, pods in pods_by_node.items():
        node_id = node_ids.get(node_name)
        if node_id is None:
            continue
        for obs in pods:
            keep.add(obs.uid)
            values = {f: getattr(obs, f) for f in POD_FIELDS}
            pod = stored.get(obs.uid)
            if pod is None:
                to_create.append(Pod(node_id=node_id, uid=obs.uid, observed_at=now, **values))
            elif pod.node_id != node_id or any(getattr(pod, f) != v for f, v in values.items()):
                for f, v in values.items():
                    setattr(pod, f, v)
                pod.node_id, pod.observed_at = node_id, now
                to_update.append(pod)
    Pod.objects.filter(pk__in=[p.pk for uid, p in stored.items() if uid not in keep]).delete()
    Pod.objects.bulk_update(to_update, [*POD_FIELDS, "node", "observed_at"], batch_size=500)
    Pod.objects.bulk_create(to_create, batch_size=500)
    return len(to_create) + len(to_update)


@transaction.atomic
def pending_pods_record(*, cluster: Cluster, pods: Sequence[PendingPodObservation], now=None) -> int:
    """Replace the cluster's pending GPU pods with this listing (idempotent): pods that started or went are removed."""
    now = now or timezone.now()
    PendingPod.objects.filter(cluster=cluster).exclude(uid__in=[p.uid for p in pods]).delete()
    stored = set(PendingPod.objects.filter(cluster=cluster).values_list("uid", flat=True))
    fields = ("namespace", "name", "labels", "gpu_resources", "node_selector", "created_at")
    PendingPod.objects.bulk_create(
        [
            PendingPod(cluster=cluster, uid=p.uid, observed_at=now, **{f: getattr(p, f) for f in fields})
            for p in pods
            if p.uid not in stored
        ],
        batch_size=500,
        ignore_conflicts=True,  # a uid listed under another cluster's row (a re-registered cluster) keeps that row
    )
    return len(pods)
