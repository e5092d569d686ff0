"""Reads of the fleet for the UI: overview aggregates, table rows sized for one page, and drawn MIG layouts."""

import re
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db.models import (
    BooleanField,
    Case,
    Count,
    ExpressionWrapper,
    F,
    FloatField,
    Max,
    Prefetch,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Cast
from django.utils import timezone

from fleet.choices import UNHEALTHY_STATES, ConfigState, GpuHealth, GpuStack, SharingMode
from fleet.labels import parse_selector, selector_matches
from fleet.models import (
    AgentCredential,
    Cluster,
    Gpu,
    GpuEvent,
    MigDevice,
    Node,
    NodePool,
    PendingAgent,
    UuidConflict,
)
from fleet.querysets import gpu_summary_aggregates, stale_q
from sharing.mig import UnknownProductError, get_product

DEFAULT_MEMORY_SLICES = 8
IN_PROGRESS_STATES = (ConfigState.PENDING, ConfigState.APPLYING, ConfigState.REBOOTING)


def pending_deadline(now=None):
    """A config change still in progress before this instant is stuck (MIG Manager can stay pending forever)."""
    seconds = settings.TESSERA.get("PENDING_DEADLINE_SECONDS", 600)
    return (now or timezone.now()) - timedelta(seconds=seconds)


def _gib(field_name: str):
    return Cast(F(field_name), FloatField()) / 1024.0


def _share_rows(rows, total: int, key: str, label) -> list[dict]:
    """Turn (key, count, mean util) rows into bar-chart rows with a percentage of the total and of the largest."""
    rows = list(rows)
    largest = max((row["count"] for row in rows), default=0)
    return [
        {
            "key": row[key],
            "label": label(row),
            "count": row["count"],
            "share_pct": round(100 * row["count"] / total, 1) if total else 0,
            "bar_pct": round(100 * row["count"] / largest, 1) if largest else 0,
            "mean_utilization": row.get("mean_utilization"),
        }
        for row in rows
    ]


# --- overview --------------------------------------------------------------------------------------------------


def _gpu_groups(gpus: QuerySet[Gpu], *keys: str) -> list[dict]:
    """Counts and sums of `gpus` grouped by `keys`, in one pass over the GPUs: every total and chart a page draws
    from them folds out of these few rows (see `_fold`), where a query per chart would read every GPU again."""
    return list(
        gpus.values(*keys)
        .annotate(
            count=Count("pk"),
            mig_enabled=Count("pk", filter=Q(mig_enabled=True)),
            mig_capable=Count("pk", filter=Q(mig_capable=True)),
            unhealthy=Count("pk", filter=Q(health__in=UNHEALTHY_STATES)),
            utilization_sum=Sum("utilization_pct"),
            utilization_n=Count("utilization_pct"),
            metrics_at=Max("metrics_at"),
        )
        .order_by()
    )


def _fold(groups: list[dict], key: str | None = None) -> list[dict] | dict:
    """Sum grouped GPU rows over everything but `key` (or over everything): counts and the mean utilisation, as the
    SQL aggregates over those GPUs would give them."""
    folded: dict = {}
    for group in groups:
        row = folded.setdefault(group[key] if key else None, {"count": 0, "mig_enabled": 0, "mig_capable": 0,
                                                               "unhealthy": 0, "utilization_sum": 0.0,
                                                               "utilization_n": 0, "metrics_at": None})  # fmt: skip
        for name in ("count", "mig_enabled", "mig_capable", "unhealthy", "utilization_sum", "utilization_n"):
            row[name] += group[name] or 0
        if group["metrics_at"] is not None and (row["metrics_at"] is None or group["metrics_at"] > row["metrics_at"]):
            row["metrics_at"] = group["metrics_at"]
    for value, row in folded.items():
        row["mean_utilization"] = row.pop("utilization_sum") / row["utilization_n"] if row["utilization_n"] else None
        del row["utilization_n"]
        if key:
            row[key] = value
    if key is None:
        return folded.get(None) or {"count": 0, "mig_enabled": 0, "mig_capable": 0, "unhealthy": 0,
                                    "mean_utilization": None, "metrics_at": None}  # fmt: skip
    return list(folded.values())


def _by_count(rows: list[dict], key: str) -> list[dict]:
    """Largest first, ties by `key`, as `order_by("-count", key)` sorts them."""
    return sorted(rows, key=lambda row: (-row["count"], row[key]))


def _gpu_totals(total: dict) -> dict:
    return {
        "gpus": total["count"],
        "mig_enabled": total["mig_enabled"],
        "mig_capable": total["mig_capable"],
        "unhealthy": total["unhealthy"],
        "mean_utilization": total["mean_utilization"],
        "metrics_at": total["metrics_at"],
    }


def fleet_overview(*, now=None, failed_also: Q | None = None, stuck_also: Q | None = None) -> dict:
    """Totals, GPUs by product / cluster / sharing mode and what needs attention, in a handful of aggregate queries.

    A node is failed when it reports a failed config, stuck when it reports one in progress past the deadline;
    `failed_also` and `stuck_also` add what layers above know (a change that failed and was rolled back leaves the
    node reporting success; a change that never started leaves it reporting nothing in progress)."""
    now = now or timezone.now()
    nodes = Node.objects.live()
    gpus = Gpu.objects.live().filter(node__gone_at__isnull=True)
    failed = Q(config_state=ConfigState.FAILED)
    stuck = Q(config_state__in=IN_PROGRESS_STATES, config_state_since__lt=pending_deadline(now))

    node_totals = nodes.aggregate(
        nodes=Count("pk"),
        failed=Count("pk", filter=failed | failed_also if failed_also is not None else failed),
        stuck=Count("pk", filter=stuck | stuck_also if stuck_also is not None else stuck),
        in_progress=Count("pk", filter=Q(config_state__in=IN_PROGRESS_STATES)),
        stale=Count("pk", filter=stale_q(now)),
        not_ready=Count("pk", filter=Q(ready=False)),
    )
    # Separate query: joining GPUs into the aggregate above would multiply every node count by its GPUs.
    # Read from the GPUs' side: only the few unhealthy ones are looked up by node.
    node_totals["with_unhealthy_gpu"] = gpus.filter(health__in=UNHEALTHY_STATES).values("node_id").distinct().count()
    # One pass over the GPUs for the totals and the three charts; cluster names come with the cluster count.
    groups = _gpu_groups(gpus, "product", "node__cluster_id", "node__observed_mode")
    gpu_totals = _gpu_totals(_fold(groups))
    total_gpus = gpu_totals["gpus"]
    cluster_names = dict(Cluster.objects.values_list("pk", "name"))
    by_product = _share_rows(
        _by_count(_fold(groups, "product"), "product"),
        total_gpus,
        "product",
        lambda row: row["product"] or "Unknown product",
    )
    clusters = _fold(groups, "node__cluster_id")
    for row in clusters:
        row["node__cluster__name"] = cluster_names[row["node__cluster_id"]]
    by_cluster = _share_rows(
        _by_count(clusters, "node__cluster__name"),
        total_gpus,
        "node__cluster_id",
        lambda row: row["node__cluster__name"],
    )
    mode_labels = dict(SharingMode.choices)
    by_mode = _share_rows(
        _by_count(_fold(groups, "node__observed_mode"), "node__observed_mode"),
        total_gpus,
        "node__observed_mode",
        lambda row: mode_labels.get(row["node__observed_mode"], "Not reported"),
    )
    return {
        "now": now,
        "stale_after_minutes": round(settings.TESSERA["STALE_AFTER_SECONDS"] / 60),
        "pending_deadline_minutes": round(settings.TESSERA.get("PENDING_DEADLINE_SECONDS", 600) / 60),
        "clusters": len(cluster_names),
        **node_totals,
        **gpu_totals,
        "by_product": by_product,
        "by_cluster": by_cluster,
        "by_mode": by_mode,
        "needs_attention": node_totals["failed"]
        + node_totals["stuck"]
        + node_totals["stale"]
        + gpu_totals["unhealthy"],
    }


# --- tables ----------------------------------------------------------------------------------------------------


NODE_ORDER = ("cluster__name", "name", "pk")
GPU_ORDER = ("node__cluster__name", "node__name", "index", "pk")
NOT_FILTERS = frozenset({"page", "ordering"})


def is_filtered(params) -> bool:
    """Whether a list's query string narrows it (paging and ordering do not)."""
    return any(value for key, value in params.items() if key not in NOT_FILTERS)


def _node_flags(now=None):
    """`is_stale` and `is_stuck` per node, computed in the database."""
    now = now or timezone.now()
    stale = stale_q(now)
    stuck = Q(config_state__in=IN_PROGRESS_STATES, config_state_since__lt=pending_deadline(now))
    return {
        "is_stale": ExpressionWrapper(stale, output_field=BooleanField()),
        "is_stuck": ExpressionWrapper(stuck, output_field=BooleanField()),
    }


def node_filter_base() -> QuerySet[Node]:
    """What NodeFilterSet narrows down; it leaves out gone nodes itself unless asked for them."""
    return Node.objects.all()


def node_filter_choices() -> dict:
    """Options of the node filter controls; each list is one small query, evaluated when the form renders."""
    return {
        "clusters": Cluster.objects.only("pk", "name"),
        "pools": NodePool.objects.select_related("cluster").only("pk", "name", "cluster__name"),
        "products": Gpu.objects.live().order_by("product").values_list("product", flat=True).distinct(),
        "modes": SharingMode.choices,
        "config_states": ConfigState.choices,
    }


class PageRows:
    """Rows a paginator counts and slices like a queryset, with `complete(rows)` run on the slice it shows: per-row
    aggregates are read for one page, not grouped over every row the count covers (B5: 0.5 s at 10,000 nodes)."""

    def __init__(self, queryset: QuerySet, complete):
        self.queryset, self.complete = queryset, complete
        self.ordered = queryset.ordered

    def count(self) -> int:
        return self.queryset.count()

    def __len__(self) -> int:
        return self.count()

    def __getitem__(self, key):
        rows = list(self.queryset[key])
        self.complete(rows)
        return rows


def _node_gpu_summaries(nodes: list[Node]) -> None:
    """Each node's GPU summary (see `gpu_summary_aggregates`), in one grouped query over the listed nodes' GPUs."""
    summaries = {
        row.pop("node_id"): row
        for row in Gpu.objects.filter(node__in=nodes)
        .values("node_id")
        .annotate(**gpu_summary_aggregates("", live=Q(gone_at__isnull=True)))
        .order_by()
    }
    empty = {"gpu_count": 0, "unhealthy_gpu_count": 0, "mean_utilization": None, "product": None, "metrics_at": None}
    for node in nodes:
        node.__dict__.update(summaries.get(node.pk, empty))


def node_rows(filtered: QuerySet[Node]) -> PageRows:
    """Rows of the node table: the filtered nodes with their neighbours, in the filter's order (a sortable column),
    ready to paginate; the nodes of the page shown get their GPU summary."""
    rows = (
        filtered.select_related("cluster", "pool")
        .annotate(**_node_flags())
        .order_by(*(filtered.query.order_by or NODE_ORDER))
    )
    return PageRows(rows, _node_gpu_summaries)


def gpu_filter_base() -> QuerySet[Gpu]:
    """What GpuFilterSet narrows down: GPUs on nodes that still exist (it leaves out gone GPUs itself)."""
    return Gpu.objects.filter(node__gone_at__isnull=True)


def gpu_filter_choices() -> dict:
    """Options of the GPU filter controls."""
    return {**node_filter_choices(), "healths": GpuHealth.choices}


def _gpu_mig_device_counts(gpus: list[Gpu]) -> None:
    counts = dict(
        MigDevice.objects.filter(gpu__in=gpus)
        .values("gpu_id")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("gpu_id", "n")
    )
    for gpu in gpus:
        gpu.mig_device_count = counts.get(gpu.pk, 0)


# What a GPU table row shows: the page sorts every live GPU to pick its 50, and PostgreSQL carried whole GPU, node and
# cluster rows (their JSON columns too) through that sort, twice the time of these columns (bench B5).
GPU_ROW_FIELDS = (
    "node__name", "node__cluster__name", "node__pool__name", "index", "uuid", "product", "memory_mib",
    "memory_used_mib", "mig_capable", "mig_enabled", "health", "utilization_pct", "temperature_c", "power_w",
    "metrics_at",
)  # fmt: skip


def gpu_rows(filtered: QuerySet[Gpu]) -> PageRows:
    """Rows of the GPU table with node, cluster and pool joined and memory in GiB, ready to paginate; the GPUs of
    the page shown get their MIG device count."""
    rows = (
        filtered.select_related("node", "node__cluster", "node__pool")
        .only(*GPU_ROW_FIELDS)
        .annotate(memory_gib=_gib("memory_mib"), memory_used_gib=_gib("memory_used_mib"))
        .order_by(*(filtered.query.order_by or GPU_ORDER))
    )
    return PageRows(rows, _gpu_mig_device_counts)


def cluster_rows() -> list[Cluster]:
    """Clusters with node, pool and GPU counts (GPU counts in one grouped query, not per row)."""
    clusters = list(Cluster.objects.with_counts())
    gpu_counts = dict(
        Gpu.objects.live()
        .filter(node__gone_at__isnull=True)
        .values_list("node__cluster_id")
        .annotate(n=Count("pk"))
        .values_list("node__cluster_id", "n")
    )
    for cluster in clusters:
        cluster.gpu_count = gpu_counts.get(cluster.pk, 0)
    return clusters


def pool_rows(*, cluster: Cluster | None = None) -> list[NodePool]:
    """Pools with their cluster, live node count and GPU count."""
    pools = NodePool.objects.select_related("cluster").with_counts()
    if cluster is not None:
        pools = pools.filter(cluster=cluster)
    pools = list(pools)
    gpu_counts = dict(
        Gpu.objects.live()
        .filter(node__gone_at__isnull=True, node__pool__isnull=False)
        .values_list("node__pool_id")
        .annotate(n=Count("pk"))
        .values_list("node__pool_id", "n")
    )
    for pool in pools:
        pool.gpu_count = gpu_counts.get(pool.pk, 0)
    return pools


MEMBERS_SHOWN = 20


@dataclass
class SelectorMatch:
    """What a node selector would select in a cluster now, for the pool editor's live preview."""

    count: int = 0
    names: list[str] = field(default_factory=list)
    error: str = ""


def selector_members(cluster: Cluster, node_selector: str, *, limit: int = MEMBERS_SHOWN) -> SelectorMatch:
    """The live nodes of `cluster` the selector matches (the first `limit` names and the count); a selector that
    does not parse gives its error instead."""
    try:
        requirements = parse_selector(node_selector)
    except ValueError as exc:
        return SelectorMatch(error=str(exc))
    match = SelectorMatch()
    nodes = Node.objects.live().filter(cluster=cluster).order_by("name").values_list("name", "labels")
    for name, labels in nodes.iterator(chunk_size=2000):
        if selector_matches(requirements, labels):
            match.count += 1
            if len(match.names) < limit:
                match.names.append(name)
    return match


def node_state_summary(nodes: QuerySet[Node], *, now=None) -> dict:
    """Counts of a set of nodes by what needs attention, for cluster and pool pages."""
    now = now or timezone.now()
    return nodes.live().aggregate(
        nodes=Count("pk"),
        failed=Count("pk", filter=Q(config_state=ConfigState.FAILED)),
        in_progress=Count("pk", filter=Q(config_state__in=IN_PROGRESS_STATES)),
        stale=Count("pk", filter=stale_q(now)),
        not_ready=Count("pk", filter=Q(ready=False)),
    )


def gpu_stack_summary(nodes: QuerySet[Node]) -> list[dict]:
    """Live nodes by the GPU stack they run (device plugin, DRA driver, DynamicMIG), most common first."""
    rows = nodes.live().values("gpu_stack", "dynamic_mig").annotate(count=Count("pk")).order_by("-count", "gpu_stack")
    labels = dict(GpuStack.choices)
    return [
        {
            "gpu_stack": row["gpu_stack"],
            "label": labels.get(row["gpu_stack"], row["gpu_stack"])
            + (" · DynamicMIG on" if row["dynamic_mig"] else ""),
            "count": row["count"],
        }
        for row in rows
    ]


def gpu_summary(gpus: QuerySet[Gpu]) -> dict:
    """GPU totals of a set of GPUs (a cluster's or a pool's), with the products: one grouped query."""
    groups = _gpu_groups(gpus.live().filter(node__gone_at__isnull=True), "product")
    totals = _gpu_totals(_fold(groups))
    totals["by_product"] = _share_rows(
        sorted(_fold(groups, "product"), key=lambda row: -row["count"]),
        totals["gpus"],
        "product",
        lambda row: row["product"],
    )
    return totals


# --- object pages ----------------------------------------------------------------------------------------------


def node_detail_queryset() -> QuerySet[Node]:
    """Nodes (including gone ones, whose page still explains what happened) with cluster and pool joined."""
    return Node.objects.select_related("cluster", "pool").annotate(**_node_flags())


def _mig_devices_prefetch() -> Prefetch:
    return Prefetch("mig_devices", queryset=MigDevice.objects.annotate(memory_gib=_gib("memory_mib")).order_by("start"))


def node_gpus(node: Node) -> list[Gpu]:
    """The node's live GPUs with their MIG devices and a drawn layout for the MIG-enabled ones."""
    gpus = list(
        node.gpus.live()
        .annotate(memory_gib=_gib("memory_mib"), memory_used_gib=_gib("memory_used_mib"))
        .prefetch_related(_mig_devices_prefetch())
        .order_by("index")
    )
    for gpu in gpus:
        gpu.mig_layout = mig_layout(gpu, gpu.mig_devices.all()) if gpu.mig_enabled else None
    return gpus


def gpu_detail_queryset() -> QuerySet[Gpu]:
    """GPUs (gone ones too) with node, cluster, pool and MIG devices, memory in GiB."""
    return (
        Gpu.objects.select_related("node", "node__cluster", "node__pool")
        .annotate(memory_gib=_gib("memory_mib"), memory_used_gib=_gib("memory_used_mib"))
        .prefetch_related(_mig_devices_prefetch())
    )


# --- MIG layout drawing ----------------------------------------------------------------------------------------

SLICE_WIDTH = 60
BLOCK_TOP = 6
BLOCK_HEIGHT = 84
AXIS_Y = BLOCK_TOP + BLOCK_HEIGHT + 16
DRAWING_HEIGHT = AXIS_Y + 6
_PROFILE_RE = re.compile(r"^(?:\d+c\.)?(?P<g>\d+)g\.(?P<rest>.+)$")
_CANONICAL_SIZE = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}


def memory_slices(product: str) -> int:
    """Memory slices of a GPU model per the MIG catalog (A30: 4); 8 when the catalog does not know the model."""
    try:
        slices = get_product(product).memory_slices
    except UnknownProductError:
        slices = 0
    return slices or DEFAULT_MEMORY_SLICES


def profile_colour(profile: str, size: int) -> str:
    """A colour class per profile family; a 1g spanning two memory slices (1g.20gb) gets its own."""
    match = _PROFILE_RE.match(profile)
    if not match:
        return "other"
    g = int(match["g"])
    if g == 1 and size >= 2:
        return "1g2"
    return f"{g}g" if g in _CANONICAL_SIZE else "other"


@dataclass
class MigBlock:
    profile: str
    start: int
    size: int
    colour: str
    x: int
    width: int
    uuid: str = ""
    in_use_by: str = ""
    memory_gib: float | None = None
    gi: int | None = None
    ci: int | None = None
    lines: tuple[str, ...] = ()
    utilization_pct: float | None = None
    memory_used_mib: int | None = None
    memory_mib: int = 0

    @property
    def end(self) -> int:
        return self.start + self.size - 1

    @property
    def centre(self) -> float:
        return self.x + self.width / 2

    @property
    def memory_used_gib(self) -> float | None:
        return None if self.memory_used_mib is None else self.memory_used_mib / 1024

    @property
    def memory_used_pct(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_mib:
            return None
        return round(100 * self.memory_used_mib / self.memory_mib, 1)

    @property
    def utilization_bar(self) -> float:
        """Width of the utilisation bar drawn along the block's foot (the block less a margin each side)."""
        return round((self.width - 12) * (self.utilization_pct or 0) / 100, 1)


@dataclass
class MigLayout:
    slices: int
    blocks: list[MigBlock]
    free: list[dict]
    legend: list[dict] = field(default_factory=list)

    @property
    def width(self) -> int:
        return self.slices * SLICE_WIDTH

    @property
    def any_in_use(self) -> bool:
        """Whether the "in use" marker appears (never on a planned layout), so the legend only explains what shows."""
        return any(b.in_use_by for b in self.blocks)

    @property
    def any_metrics(self) -> bool:
        """Whether any slice shows a utilisation bar (observed MIG devices that dcgm-exporter reported)."""
        return any(b.utilization_pct is not None for b in self.blocks)

    @property
    def axis(self) -> list[dict]:
        return [{"index": i, "x": i * SLICE_WIDTH + SLICE_WIDTH // 2} for i in range(self.slices)]

    @property
    def summary(self) -> str:
        """The drawing in words (its text alternative): each device's profile, place and size, who uses it."""
        parts = []
        for b in self.blocks:
            where = f"slice {b.start}" if b.size == 1 else f"slices {b.start}–{b.end}"
            part = f"{b.profile} on memory {where} ({b.size} of {self.slices})"
            parts.append(part + (f", in use by {b.in_use_by}" if b.in_use_by else ""))
        free = [str(slot["index"]) for slot in self.free]
        parts.append(f"free: slice{'s' if len(free) != 1 else ''} {', '.join(free)}" if free else "no free slice")
        return f"MIG layout over {self.slices} memory slices: " + "; ".join(parts)


def mig_layout(gpu: Gpu, mig_devices) -> MigLayout:
    """Geometry of the MIG drawing: one block per device over its memory slices, free slices listed for hatching."""
    devices = sorted(mig_devices, key=lambda d: d.start)
    slices = max([memory_slices(gpu.product), *(d.start + d.size for d in devices)])
    used = set()
    blocks = []
    for device in devices:
        used.update(range(device.start, device.start + device.size))
        match = _PROFILE_RE.match(device.profile)
        # Narrow blocks get the profile on two lines ("1g" over "10gb") so it fits the column.
        lines = (f"{match['g']}g", match["rest"]) if match and device.size < 3 else (device.profile,)
        blocks.append(
            MigBlock(
                profile=device.profile,
                start=device.start,
                size=device.size,
                colour=profile_colour(device.profile, device.size),
                x=device.start * SLICE_WIDTH,
                width=device.size * SLICE_WIDTH,
                uuid=device.uuid,
                in_use_by=device.in_use_by,
                memory_gib=getattr(device, "memory_gib", None),
                gi=device.gpu_instance_id,
                ci=device.compute_instance_id,
                lines=lines,
                utilization_pct=getattr(device, "utilization_pct", None),
                memory_used_mib=getattr(device, "memory_used_mib", None),
                memory_mib=getattr(device, "memory_mib", 0),
            )
        )
    free = [{"index": i, "x": i * SLICE_WIDTH} for i in range(slices) if i not in used]
    legend: dict[str, dict] = {}
    for block in blocks:
        entry = legend.setdefault(block.profile, {"profile": block.profile, "colour": block.colour, "count": 0})
        entry["count"] += 1
    return MigLayout(slices=slices, blocks=blocks, free=free, legend=list(legend.values()))


@dataclass(frozen=True)
class _PlannedDevice:
    """A MIG device of a layout not applied yet, in the shape `mig_layout` draws."""

    profile: str
    start: int
    size: int
    uuid: str = ""
    in_use_by: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class _PlannedGpu:
    product: str


def planned_mig_layout(product: str, placements) -> MigLayout:
    """The MIG drawing of a layout before it is applied, from `validate_layout(...).placements` of that product."""
    devices = [_PlannedDevice(p.profile, p.start, p.size) for p in placements]
    return mig_layout(_PlannedGpu(product), devices)


def gpu_events(gpu, limit: int = 50) -> list[GpuEvent]:
    """The GPU's XID and ECC events, newest first."""
    return list(GpuEvent.objects.filter(gpu=gpu).order_by("-at", "-pk")[:limit])


def node_agent_credential(node: Node) -> AgentCredential | None:
    """The node's active agent credential (at most one), else its last revoked one, with its join token: one query."""
    active_first = Case(When(revoked_at__isnull=True, then=Value(0)), default=Value(1))
    credentials = AgentCredential.objects.filter(node=node).select_related("join_token")
    return credentials.order_by(active_first, "-created_at", "-pk").first()


def node_uuid_conflicts(node: Node) -> list[UuidConflict]:
    """Open UUID conflicts the node is in, as the reporter refused or as the holder, oldest first."""
    return list(
        UuidConflict.objects.filter(Q(node=node) | Q(holder=node), resolved_at__isnull=True)
        .select_related("node", "holder")
        .order_by("first_seen_at", "pk")
    )


PENDING_AGENTS_SHOWN = 50


def pending_agents() -> list[PendingAgent]:
    """Agents waiting for an admin to approve their registration of an existing node, oldest first; expired
    requests are not shown."""
    return list(
        PendingAgent.objects.current()
        .filter(status=PendingAgent.Status.PENDING)
        .select_related("node", "node__cluster", "join_token")
        .order_by("requested_at", "pk")[:PENDING_AGENTS_SHOWN]
    )
