"""Reads of the sharing app: the impact preview of a profile on nodes, and desired-vs-observed per node."""

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from django.db.models import Count, Prefetch

from core.exceptions import ApplicationError
from fleet.choices import ClusterDriver
from fleet.models import Cluster, Gpu, Node, NodePool, Pod
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


DISRUPTION_TEXT = {
    "none": "No change",
    "device-plugin": "Device plugin reconfigures (running pods keep their GPUs)",
    "mig-geometry": "MIG geometry changes (no GPU reset)",
    "gpu-reset": "MIG mode changes: GPU reset (node reboot where resets are not possible)",
}


def _preview_nodes(nodes):
    live_gpus = Gpu.objects.live().only("node_id", "index", "product", "mig_enabled").order_by("index")
    return (
        nodes.select_related("cluster", "pool")
        .prefetch_related(Prefetch("gpus", queryset=live_gpus, to_attr="live_gpus"), "live_gpus__mig_devices", "pods")
        .order_by("name")
    )


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
        observed = Counter(d.profile for d in gpu.mig_devices.all())
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


def node_impact(profile: SharingProfile, node: Node) -> NodeImpact:
    """The impact of `profile` on one node prefetched by `_preview_nodes`, as the node's cluster would run it."""
    spec = under_cluster_strategy(profile.to_spec(), node.cluster.mig_strategy)
    gpus = [(g.index, g.product) for g in node.live_gpus]
    before = {k: v for k, v in node.allocatable.items() if k.startswith("nvidia.com/")}
    errors = node_validation_errors(spec, gpus)
    if errors:
        return NodeImpact(node, errors, before, {}, "none", [])
    config = node_config(spec, gpus)
    after = allocatable(spec, gpus)
    resets = mig_mode_changes(spec, [(g.index, g.product, g.mig_enabled) for g in node.live_gpus])
    if resets:
        disruption = "gpu-reset"
    elif _geometry_changes(spec, node.live_gpus):
        disruption = "mig-geometry"
    elif config.device_plugin_key != node.observed_device_plugin_config or after != before:
        disruption = "device-plugin"
    else:
        disruption = "none"
    losing = _pods_losing(node.pods.all(), after) if disruption != "none" else []
    return NodeImpact(node, [], before, after, disruption, resets, losing, config)


def profile_preview(profile: SharingProfile, nodes) -> list[NodeImpact]:
    """Per node: resources before → after, reset or not, pods that lose their slice, or why it cannot apply.
    Refused as a whole (ApplicationError) when a cluster's MIG strategy cannot run the profile at all."""
    refuse_under_cluster_strategies(profile, nodes)
    return [node_impact(profile, node) for node in _preview_nodes(nodes)]


def preview_summary(impacts: list[NodeImpact]) -> dict:
    """Totals for the top of a preview: nodes touched, refused, resetting (nodes) and the GPUs they reset, pods
    affected."""
    return {
        "nodes": len(impacts),
        "changing": sum(1 for i in impacts if i.changes),
        "refused": sum(1 for i in impacts if i.errors),
        "resetting": sum(1 for i in impacts if i.disruption == "gpu-reset"),
        "gpus_resetting": sum(len(i.reset_gpus) for i in impacts if i.disruption == "gpu-reset"),
        "pods_losing": sum(len(i.pods_losing) for i in impacts),
    }


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
