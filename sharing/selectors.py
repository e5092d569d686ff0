"""Reads of the sharing app: the impact preview of a profile on nodes, and desired-vs-observed per node."""

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from functools import cache

from django.db.models import Aggregate, Case, CharField, Count, Exists, Func, OuterRef, Subquery, When
from django.db.models import Value as V
from django.db.models.functions import Coalesce

from core.exceptions import ApplicationError
from fleet.choices import DRA_STACKS, ClusterDriver, GpuStack
from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool, Pod
from sharing.models import PoolSharing, SharingProfile
from sharing.nvidia_import import ClusterConfigs, ImportPlan, ProposedProfile, plan_import
from sharing.qos import PodView
from sharing.spec import (
    NodeConfig,
    ProfileSpec,
    allocatable,
    cluster_strategy_problems,
    mig_mode_changes,
    node_config,
    node_validation_errors,
    under_cluster_strategy,
)


@dataclass
class NodeImpact:
    """What applying a profile would do to one node."""

    node: Node
    errors: list[str]
    allocatable_before: dict[str, int]
    allocatable_after: dict[str, int]
    disruption: str  # "none", "device-plugin", "mig-geometry", "gpu-reset"
    reset_gpus: list[int]
    pods_losing: list[Pod] = field(default_factory=list)
    config: NodeConfig | None = None

    @property
    def changes(self) -> bool:
        return self.disruption != "none"

    @property
    def assumption(self) -> str:
        """What the preview assumed that the node does not have, or "" (issue 26: DRA nodes are read as device-plugin
        ones until their claims and slices are)."""
        return DRA_ASSUMPTION if self.node.gpu_stack in DRA_STACKS else ""


def dra_refusals(spec, stack: str) -> list[str]:
    """What a DRA node cannot take through labels and ConfigMaps (docs/nvidia-contracts.md §13.4): time-slicing and MPS
    (the driver shares per claim; a device-plugin config is read by nothing), and under a GPUCluster a MIG layout
    (no MIG Manager reads `nvidia.com/mig.config` there)."""
    if not stack:
        return []
    if spec.mode in ("mps", "time_slicing"):
        return [
            "NVIDIA's DRA driver serves this node: it shares a GPU per ResourceClaim (GpuConfig), and the device "
            "plugin's time-slicing or MPS config would be read by nothing"
        ]
    if stack == GpuStack.DRA_GPU_CLUSTER and spec.mode == "mig":
        return [
            "this node runs under a GPUCluster, which has no MIG Manager: nvidia.com/mig.config is read by nothing. "
            "Use Tessera's node agent on it, or the DRA driver's DynamicMIG"
        ]
    return []


DRA_ASSUMPTION = (
    "Assumed the device plugin, but NVIDIA's DRA driver serves this node: resources are the device plugin's names "
    "for its devices (pods count by what their ResourceClaims hold), and a device-plugin config (time-slicing, "
    "MPS) written here is read by nothing."
)


DISRUPTION_TEXT = {
    "none": "No change",
    "device-plugin": "Device plugin reconfigures (running pods keep their GPUs)",
    "mig-geometry": "MIG geometry changes (no GPU reset)",
    "gpu-reset": "MIG mode changes: GPU reset (node reboot where resets are not possible)",
}


@dataclass
class _PreviewGpu:
    """What a preview reads of a live GPU: its place, product, MIG mode and the profiles of its MIG devices."""

    index: int
    product: str
    mig_enabled: bool
    mig_profiles: list[str] = field(default_factory=list)


def _attach_gpus_and_pods(nodes: dict) -> None:
    """Give each node of `nodes` (by id) its `live_gpus` (`_PreviewGpu`, in index order) and `pod_list`: three
    queries, GPUs and MIG devices (counted per GPU and profile) read as tuples (model instances and a related manager
    per GPU cost more than the rest of a 500-node preview, bench B5)."""
    ids = list(nodes)
    by_id: dict[int, _PreviewGpu] = {}
    for node in nodes.values():
        node.live_gpus, node.pod_list = [], []
    rows = Gpu.objects.live().filter(node_id__in=ids).order_by("node_id", "index")
    for pk, node_id, index, product, mig_enabled in rows.values_list(
        "pk", "node_id", "index", "product", "mig_enabled"
    ):
        gpu = by_id[pk] = _PreviewGpu(index, product, mig_enabled)
        nodes[node_id].live_gpus.append(gpu)
    devices = MigDevice.objects.filter(gpu__node_id__in=ids, gpu__gone_at__isnull=True)
    for gpu_id, profile, count in devices.values_list("gpu_id", "profile").annotate(n=Count("pk")).order_by():
        by_id[gpu_id].mig_profiles += [profile] * count
    for pod in Pod.objects.filter(node_id__in=ids):
        nodes[pod.node_id].pod_list.append(pod)


def _preview_nodes(nodes) -> list[Node]:
    """The nodes in name order, each with `live_gpus` and `pod_list` (`_attach_gpus_and_pods`): four queries."""
    nodes = list(nodes.select_related("cluster", "pool").order_by("name"))
    _attach_gpus_and_pods({node.pk: node for node in nodes})
    return nodes


def _pods_losing(pods, after: dict[str, int]) -> list[Pod]:
    """Pods whose GPU resources the node will no longer advertise, or not in the amount they hold."""
    left = dict(after)
    losing = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        fits = all(left.get(name, 0) >= count for name, count in pod.gpu_resources.items())
        if fits:
            for name, count in pod.gpu_resources.items():
                left[name] -= count
        else:
            losing.append(pod)
    return losing


def _geometry_changes(spec, gpus) -> bool:
    """Whether any MIG-enabled GPU would get a different set of MIG devices than it reports now."""
    for gpu in gpus:
        if not gpu.mig_enabled:
            continue
        observed = Counter(gpu.mig_profiles)
        wanted = Counter({name: n for name, n in (spec.layout_for(gpu.index) or {}).items() if n})
        if observed != wanted:
            return True
    return False


def cluster_strategy_errors(profile: SharingProfile, nodes, clusters: tuple[Cluster, ...] = ()) -> list[str]:
    """Why the profile cannot run under the MIG strategy of these nodes' clusters (and of `clusters`, for a pool
    without nodes yet), one message per cluster and rule; two queries, none for a mode no strategy restricts."""
    spec = profile.to_spec()
    if spec.mode not in ("mig", "mps"):
        return []
    rows = list(nodes.exclude(cluster__mig_strategy="").values_list("pk", "cluster__name", "cluster__mig_strategy"))
    indices = defaultdict(list)
    for node_id, index in Gpu.objects.live().filter(node_id__in=[r[0] for r in rows]).values_list("node_id", "index"):
        indices[node_id].append(index)
    checks = [(name, strategy, sorted(indices[pk])) for pk, name, strategy in rows]
    checks += [(cluster.name, cluster.mig_strategy, []) for cluster in clusters]
    messages = [m for name, strategy, gpus in checks for m in cluster_strategy_problems(spec, name, strategy, gpus)]
    return list(dict.fromkeys(messages))


def profile_on_clusters(profile_spec: ProfileSpec) -> list[dict]:
    """Each Kubernetes cluster whose ClusterPolicy has been read, with the rules its MIG strategy says this profile
    breaks there (for the profile's pages; the cluster's device-plugin version says what MPS requests get)."""
    clusters = Cluster.objects.exclude(cluster_policy_read_at=None).order_by("name")
    return [
        {"cluster": c, "problems": cluster_strategy_problems(profile_spec, c.name, c.mig_strategy)}
        for c in clusters.only("pk", "name", "mig_strategy", "device_plugin_version")
    ]


def refuse_under_cluster_strategies(profile: SharingProfile, nodes, clusters: tuple[Cluster, ...] = ()) -> None:
    """A 400 naming the cluster and the rule when its MIG strategy (which the GPU Operator imposes on the device
    plugin) cannot run the profile: preview, assignment, pins and schedules all refuse it the same way."""
    messages = cluster_strategy_errors(profile, nodes, clusters)
    if messages:
        raise ApplicationError(f"{profile.name} cannot run there: {messages[0]}.", errors={"profile": messages})


def _rendered(profile: SharingProfile, strategy: str, gpus: tuple, stack: str = "") -> tuple:
    """The profile as a cluster with `strategy` runs it on these GPUs: its spec, and its errors, or its configs and
    the resources they advertise. Pure, and the same for every node of one GPU shape and DRA stack ("" otherwise)."""
    spec = under_cluster_strategy(profile.to_spec(), strategy)
    errors = node_validation_errors(spec, gpus) + dra_refusals(spec, stack)
    if stack:
        errors += [
            f"GPU {index}: MIG mode on with no MIG instance; NVIDIA's DRA driver publishes nothing for such a GPU, "
            "so it would vanish from the node's pool (docs/nvidia-contracts.md §13.1)"
            for index, product in gpus
            if spec.mode == "mig" and spec.layout_for(index) is not None and not any(spec.layout_for(index).values())
        ]
    if errors:
        return spec, errors, None, {}
    return spec, [], node_config(spec, gpus), allocatable(spec, gpus)


def node_impact(profile: SharingProfile, node: Node, shapes: dict | None = None) -> NodeImpact:
    """The impact of `profile` on one node prefetched by `_preview_nodes`, as the node's cluster would run it.
    `shapes` keeps the rendering per cluster strategy and GPU shape across a preview: a pool of 500 nodes has a
    handful of shapes, and rendering each node's configs again was most of a schedule page (bench B5)."""
    return _impact(profile, node, node.cluster.mig_strategy, shapes)


def _impact(profile: SharingProfile, node, strategy: str, shapes: dict | None) -> NodeImpact:
    """`node_impact` of a node (or a `_ShapeNode`) whose cluster runs MIG strategy `strategy`."""
    gpus = tuple((g.index, g.product) for g in node.live_gpus)
    stack = node.gpu_stack if node.gpu_stack in DRA_STACKS else ""
    key = (strategy, gpus, stack)
    shapes = {} if shapes is None else shapes
    if key not in shapes:
        shapes[key] = _rendered(profile, strategy, gpus, stack)
    spec, errors, config, after = shapes[key]
    before = _advertised(node.allocatable)
    if errors:
        return NodeImpact(node, errors, before, {}, "none", [])
    resets = mig_mode_changes(spec, [(g.index, g.product, g.mig_enabled) for g in node.live_gpus])
    if resets:
        disruption = "gpu-reset"
    elif _geometry_changes(spec, node.live_gpus):
        disruption = "mig-geometry"
    elif config.device_plugin_key != node.observed_device_plugin_config or after != before:
        disruption = "device-plugin"
    else:
        disruption = "none"
    losing = _pods_losing(node.pod_list, after) if disruption != "none" else []
    return NodeImpact(node, [], before, after, disruption, resets, losing, config)


def _advertised(allocatable: dict) -> dict[str, int]:
    """The GPU resources among a node's allocatable ones."""
    return {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/")}


def profile_preview(profile: SharingProfile, nodes) -> list[NodeImpact]:
    """Per node: resources before → after, reset or not, pods that lose their slice, or why it cannot apply.
    Refused as a whole (ApplicationError) when a cluster's MIG strategy cannot run the profile at all."""
    refuse_under_cluster_strategies(profile, nodes)
    shapes: dict = {}
    return [node_impact(profile, node, shapes) for node in _preview_nodes(nodes)]


def preview_summary(impacts: list[NodeImpact]) -> dict:
    """Totals for the top of a preview: nodes touched, refused, resetting (nodes) and the GPUs they reset, pods
    affected."""
    return _totals((impact, 1) for impact in impacts)


def _totals(weighted) -> dict:
    """`preview_summary` of (impact, how many nodes it stands for) pairs."""
    totals = dict.fromkeys(("nodes", "changing", "refused", "resetting", "gpus_resetting", "pods_losing"), 0)
    for impact, count in weighted:
        totals["nodes"] += count
        totals["changing"] += count * impact.changes
        totals["refused"] += count * bool(impact.errors)
        if impact.disruption == "gpu-reset":
            totals["resetting"] += count
            totals["gpus_resetting"] += count * len(impact.reset_gpus)
        totals["pods_losing"] += count * len(impact.pods_losing)
    return totals


class _Joined(Aggregate):
    """A group's texts joined by a separator, in no set order (SQLite GROUP_CONCAT, PostgreSQL STRING_AGG)."""

    function = "GROUP_CONCAT"
    output_field = CharField()

    def __init__(self, expression, separator: str):
        super().__init__(expression, V(separator))

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="STRING_AGG", **extra)


@cache
def _gpu_signatures():
    """Per node, its live GPUs as `index|product|mig|profile+…` joined by `;`, built in the database: what a node's
    impact depends on besides its cluster, configs and pods, without a row per GPU and MIG device in Python. MIG
    devices are looked up only for MIG-enabled GPUs, the only ones whose devices an impact reads
    (`_geometry_changes`): a lookup per GPU was a third of the query. Built once: the expression never changes (a
    query resolves a copy), and building it was a millisecond of every schedule page (bench B5)."""
    profiles = (
        MigDevice.objects.filter(gpu=OuterRef("pk"))
        .order_by()
        .values("gpu")
        .annotate(p=_Joined("profile", "+"))
        .values("p")
    )
    gpu = Func(  # `||` rather than Concat: its nested COALESCE pairs took longer to compile than the query to run
        "index",
        "product",
        Case(When(mig_enabled=True, then=V("1")), default=V("0")),
        Case(When(mig_enabled=True, then=Coalesce(Subquery(profiles), V(""))), default=V("")),
        template="(%(expressions)s)",
        arg_joiner=" || '|' || ",
        output_field=CharField(),
    )
    gpus = Gpu.objects.live().filter(node=OuterRef("pk")).order_by().values("node").annotate(s=_Joined(gpu, ";"))
    return Subquery(gpus.values("s"))


def _shape_gpus(signature: str | None) -> list[_PreviewGpu]:
    """The GPUs of a `_gpu_signatures` signature, in index order (`|`, `+` and `;` occur in no product or MIG
    profile name: both are Kubernetes label values)."""
    gpus = []
    for text in filter(None, (signature or "").split(";")):
        index, product, mig, profiles = text.split("|")
        gpus.append(_PreviewGpu(int(index), product, mig == "1", profiles.split("+") if profiles else []))
    return sorted(gpus, key=lambda g: g.index)


@dataclass
class _ShapeNode:
    """What a node's impact is computed from (`preview_totals`)."""

    observed_device_plugin_config: str
    allocatable: dict
    live_gpus: list
    pod_list: list = field(default_factory=list)
    gpu_stack: str = ""


def preview_totals(profile: SharingProfile, nodes) -> dict:
    """`preview_summary(profile_preview(profile, nodes))` without a row per node in Python: nodes without pods are
    grouped by cluster strategy and shape (GPUs and their MIG devices, device-plugin config, advertised resources),
    built in the database, and the impact computed once per group; nodes with pods get theirs each. The schedule
    page shows only these totals, and a preview of every node cost ~0.15 ms a node at 476 nodes (bench B5)."""
    refuse_under_cluster_strategies(profile, nodes)
    # Grouped in the database too (a node with pods is a group of its own), so Python decodes a row per shape, not
    # per node: decoding every node's allocatable was a third of the preview at 476 nodes (bench B5).
    rows = (
        nodes.annotate(
            busy_pk=Case(When(Exists(Pod.objects.filter(node=OuterRef("pk"))), then="pk")),
            gpu_signature=_gpu_signatures(),
        )
        .order_by()
        .values(
            "busy_pk", "cluster__mig_strategy", "observed_device_plugin_config", "allocatable", "gpu_signature",
            "gpu_stack",
        )
        .annotate(count=Count("pk"))
        .values_list(
            "busy_pk", "cluster__mig_strategy", "observed_device_plugin_config", "allocatable", "gpu_signature",
            "gpu_stack", "count",
        )
    )  # fmt: skip
    groups: Counter = Counter()
    busy = []
    for busy_pk, strategy, config, allocatable_now, signature, stack, count in rows:
        if busy_pk is not None:
            busy.append(busy_pk)
        else:
            advertised = tuple(sorted(_advertised(allocatable_now or {}).items()))
            groups[(strategy, config, advertised, signature, stack)] += count
    shapes: dict = {}
    weighted = [
        (
            _impact(
                profile,
                _ShapeNode(config, dict(advertised), _shape_gpus(signature), gpu_stack=stack),
                strategy,
                shapes,
            ),
            count,
        )
        for (strategy, config, advertised, signature, stack), count in groups.items()
    ]
    if busy:
        weighted += [
            (_impact(profile, node, node.cluster.mig_strategy, shapes), 1)
            for node in _preview_nodes(Node.objects.filter(pk__in=busy))
        ]
    return _totals(weighted)


def pool_pod_views(pool) -> tuple[list[PodView], dict[str, int], list[Node]]:
    """The pool's observed GPU pods as the QoS rules read them, live GPUs per node name, and the live nodes."""
    nodes = list(pool.nodes.live().only("pk", "name", "kubelet_config"))
    gpus = dict(Gpu.objects.live().filter(node__in=nodes).values_list("node__name").annotate(n=Count("pk")))
    pods = [
        PodView(p.namespace, p.name, p.node.name, p.spec, p.gpu_resources, p.priority_class)
        for p in Pod.objects.filter(node__in=nodes)
        .select_related("node")
        .only("namespace", "name", "spec", "gpu_resources", "priority_class", "node__name")
    ]
    return pods, gpus, nodes


def profiles_under_pool_policy(pool) -> list[SharingProfile]:
    """Profiles the pool's default QoS policy runs with: its default profile and every schedule window that has no
    policy of its own (reverse relations, so sharing needs no import of scheduling)."""
    default = PoolSharing.objects.filter(pool=pool).select_related("profile").first()
    profiles = [default.profile] if default and default.profile else []
    schedule = getattr(pool, "schedule", None)
    if schedule is not None:
        profiles += [w.profile for w in schedule.windows.filter(qos_policy__isnull=True).select_related("profile")]
    return list({p.pk: p for p in profiles}.values())


def pools_without_pods_to_check(pools: list[NodePool]) -> set[int]:
    """Agent pools with no pod observed: their nodes report GPU processes, not Kubernetes pods, so a report there
    would say "compliant" of nothing."""
    agent = [p.pk for p in pools if p.cluster.driver == ClusterDriver.AGENT]
    with_pods = set(
        Pod.objects.filter(node__pool_id__in=agent).order_by().values_list("node__pool_id", flat=True).distinct()
    )
    return set(agent) - with_pods


@dataclass(frozen=True)
class ImportPreview:
    """What importing a cluster's NVIDIA configs would do: the plan, and which proposed names exist already."""

    plan: ImportPlan
    existing: frozenset[str]

    @property
    def creatable(self) -> list[ProposedProfile]:
        return [p for p in self.plan.profiles if p.accepted and p.name not in self.existing]


def nvidia_import_preview(cluster, configs: ClusterConfigs) -> ImportPreview:
    """The import of `configs` (read from `cluster` by its driver) judged against the cluster's inventory: each
    node's GPUs and the products the cluster has, so profiles target what its nodes carry."""
    gpus: dict[str, list[tuple[int, str]]] = {}
    for node_name, index, product in (
        Gpu.objects.live().filter(node__cluster=cluster).values_list("node__name", "index", "product")
    ):
        gpus.setdefault(node_name, []).append((index, product))
    nodes = tuple(replace(node, gpus=tuple(sorted(gpus.get(node.name, ())))) for node in configs.nodes)
    products = tuple(sorted({product for node_gpus in gpus.values() for _, product in node_gpus}))
    plan = plan_import(replace(configs, nodes=nodes, products=products))
    names = [p.name for p in plan.profiles]
    return ImportPreview(plan, frozenset(SharingProfile.objects.filter(name__in=names).values_list("name", flat=True)))
