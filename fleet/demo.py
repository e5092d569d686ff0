"""A realistic, deterministic demo fleet recorded through the same services as real observations."""

import random
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from core.audit import Actor
from fleet import services
from fleet.models import Cluster, NodePool
from fleet.observations import GpuMetrics, GpuObservation, MigDeviceMetrics, MigDeviceObservation, NodeObservation
from sharing.mig import PRODUCTS, validate_layout


@dataclass(frozen=True)
class DemoPool:
    cluster: str
    name: str
    prefix: str
    product: str
    nodes: int
    gpus_per_node: int
    mode: str
    layout: dict | None = None  # MIG layout per GPU
    replicas: int = 1


ACTOR = Actor.system("seed_demo")
DEMO_CLUSTERS = {
    "prod-east": {"driver": "kubernetes", "kubeconfig_path": "prod-east.yaml"},
    "lab-west": {"driver": "agent"},
}
DEMO_POOLS = (
    DemoPool("prod-east", "inference", "inf-h100", "NVIDIA-H100-80GB-HBM3", 17, 8, "mig", {"1g.10gb": 7}),
    DemoPool("prod-east", "training", "trn-h100", "NVIDIA-H100-80GB-HBM3", 12, 8, "passthrough"),
    DemoPool("prod-east", "notebooks", "nb-a100", "NVIDIA-A100-SXM4-80GB", 10, 8, "time_slicing", replicas=4),
    DemoPool("lab-west", "batch-a30", "a30", "NVIDIA-A30", 12, 4, "mig", {"2g.12gb": 1, "1g.6gb": 2}),
    DemoPool("lab-west", "edge-l4", "l4", "NVIDIA-L4", 10, 4, "mps", replicas=8),
)
WORKLOADS = ("ml-serving/llama-8b", "ml-serving/whisper", "research/nb-alice", "research/nb-bob", "batch/embed")


def _uuid(rng: random.Random, prefix: str) -> str:
    return f"{prefix}-{uuid.UUID(int=rng.getrandbits(128), version=4)}"


def _gpu_instance_id(product, placement) -> int:
    """The GPU instance id the driver gives a placement: the whole GPU 0, then the halves, quarters, eighths in
    order (A100/H100: 1-2, 3-6, 7-13; A30: 1-2, 3-6)."""
    return product.memory_slices // placement.size - 1 + placement.start // placement.size


def _node_observation(rng: random.Random, pool: DemoPool, index: int) -> NodeObservation:
    product = PRODUCTS[pool.product]
    name = f"{pool.prefix}-{index:02d}"
    gpus = []
    placements = validate_layout(product, pool.layout).placements if pool.layout else ()
    for i in range(pool.gpus_per_node):
        mig_devices = tuple(
            MigDeviceObservation(
                profile=p.profile,
                start=p.start,
                size=p.size,
                uuid=_uuid(rng, "MIG"),
                gpu_instance_id=_gpu_instance_id(product, p),
                memory_mib=product.mig_profile(p.profile).memory_mib,
                in_use_by=f"{rng.choice(WORKLOADS)}-{rng.randrange(16**5):05x}" if rng.random() < 0.6 else "",
            )
            for p in placements
        )
        gpus.append(
            GpuObservation(
                index=i,
                uuid=_uuid(rng, "GPU"),
                product=product.name,
                memory_mib=product.memory_mib,
                pci_bus_id=f"00000000:{0x18 + i * 0x10:02X}:00.0",
                pci_device_id=product.pci_device_id,
                numa_node=0 if i < pool.gpus_per_node // 2 else 1,
                mig_capable=product.mig_capable,
                mig_enabled=pool.mode == "mig",
                health="healthy",
                mig_devices=mig_devices,
            )
        )
    if pool.mode == "mig":
        allocatable = {}
        for p in placements:
            key = product.mig_profile(p.profile).resource_name
            allocatable[key] = allocatable.get(key, 0) + pool.gpus_per_node
        mig_config = "all-" + "-".join(f"{n}x{c}" for n, c in pool.layout.items())
    else:
        resource = "nvidia.com/gpu.shared" if pool.replicas > 1 else "nvidia.com/gpu"
        allocatable = {resource: pool.gpus_per_node * pool.replicas}
        mig_config = "all-disabled" if product.mig_capable else ""
    strategy = {"time_slicing": "time-slicing", "mps": "mps"}.get(pool.mode, "none")
    labels = {
        "kubernetes.io/hostname": name,
        "tessera.io/pool": pool.name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product.name,
        "nvidia.com/gpu.count": str(pool.gpus_per_node),
        "nvidia.com/gpu.memory": str(product.memory_mib),
        "nvidia.com/gpu.family": product.architecture,
        "nvidia.com/mig.capable": str(product.mig_capable).lower(),
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/gpu.replicas": str(pool.replicas),
    }
    if mig_config:
        labels.update({"nvidia.com/mig.config": mig_config, "nvidia.com/mig.config.state": "success"})
    return NodeObservation(
        name=name,
        labels=labels,
        ready=True,
        allocatable=allocatable,
        kubelet_version="v1.32.4",
        driver_version="570.133.20",
        cuda_version="12.8",
        numa_nodes=2,
        observed_mode=pool.mode,
        observed_mig_config=mig_config,
        config_state="success",
        gpus=tuple(gpus),
    )


def _with_trouble(obs: NodeObservation, kind: str) -> NodeObservation:
    """A few nodes that need attention, so the demo shows what an operator would see at 3 a.m."""
    if kind == "failed":
        return replace(
            obs,
            config_state="failed",
            last_error="MIG Manager: nvidia-mig-parted apply failed: GPU 3 is in use by pod ml-serving/llama-8b-3f2a1",
        )
    if kind == "pending":
        return replace(obs, config_state="pending")
    if kind == "cordoned":
        return replace(obs, unschedulable=True)
    return replace(obs, ready=False)


def _slice_metrics(gpu: GpuObservation) -> tuple[MigDeviceMetrics, ...]:
    """Utilisation and memory of each MIG slice: busy where a pod holds it (a generator of the GPU's own, so the
    rest of the demo draws what it drew before)."""
    rng = random.Random(f"slices:{gpu.uuid}")
    metrics = []
    for device in gpu.mig_devices or ():
        util = round(rng.uniform(50, 97) if device.in_use_by else rng.uniform(0, 4), 1)
        fraction = rng.uniform(0.35, 0.9) if device.in_use_by else 0.005
        metrics.append(MigDeviceMetrics(device.gpu_instance_id, util, int(device.memory_mib * fraction)))
    return tuple(metrics)


@transaction.atomic
def seed_demo(*, seed: int = 7) -> dict:
    """Create (or refresh, idempotently) the demo fleet; returns counts for the command's output."""
    rng = random.Random(seed)
    now = timezone.now()
    clusters = {}
    for name, values in DEMO_CLUSTERS.items():
        clusters[name] = Cluster.objects.filter(name=name).first() or services.cluster_create(
            actor=ACTOR, name=name, description="Demo data from `manage.py seed_demo`.", **values
        )
    for pool in DEMO_POOLS:
        if not NodePool.objects.filter(cluster=clusters[pool.cluster], name=pool.name).exists():
            services.pool_create(
                actor=ACTOR,
                cluster=clusters[pool.cluster],
                name=pool.name,
                node_selector=f"tessera.io/pool={pool.name}",
            )

    trouble = {("inference", 3): "failed", ("inference", 9): "pending", ("training", 5): "cordoned"}
    stale = {("notebooks", 7), ("edge-l4", 2), ("batch-a30", 11)}
    observations: dict[str, list] = {name: [] for name in clusters}
    stale_obs: dict[str, list] = {name: [] for name in clusters}
    for pool in DEMO_POOLS:
        for i in range(1, pool.nodes + 1):
            obs = _node_observation(rng, pool, i)
            if (pool.name, i) in trouble:
                obs = _with_trouble(obs, trouble[(pool.name, i)])
            (stale_obs if (pool.name, i) in stale else observations)[pool.cluster].append(obs)

    gpu_count = 0
    for name, cluster in clusters.items():
        services.inventory_record(cluster=cluster, nodes=observations[name], now=now)
        services.inventory_record(cluster=cluster, nodes=stale_obs[name], now=now - timedelta(hours=2))
        gpu_count += sum(len(o.gpus) for o in observations[name] + stale_obs[name])

    samples = []
    unhealthy = {7: 79, 21: 48, 40: 13}  # node ordinal -> XID on its GPU 0
    for n, obs in enumerate(o for lists in observations.values() for o in lists):
        for gpu in obs.gpus:
            busy = any(d.in_use_by for d in gpu.mig_devices or ()) or rng.random() < 0.7
            util = round(rng.uniform(45, 98) if busy else rng.uniform(0, 12), 1)
            memory = PRODUCTS[gpu.product].memory_mib
            xid = unhealthy.get(n) if gpu.index == 0 else None
            used = int(memory * min(0.97, util / 100 + rng.uniform(0, 0.2)))
            slices = _slice_metrics(gpu)
            if slices:  # as dcgm-exporter reports a MIG GPU: per slice; the GPU is their weighted mean and sum
                sizes = {d.gpu_instance_id: d.size for d in gpu.mig_devices}
                util = round(sum(s.utilization_pct * sizes[s.gpu_instance_id] for s in slices) / sum(sizes.values()), 1)
                used = sum(s.memory_used_mib for s in slices)
            samples.append(
                GpuMetrics(
                    uuid=gpu.uuid,
                    utilization_pct=util,
                    memory_used_mib=used,
                    temperature_c=round(32 + util * 0.45 + rng.uniform(-3, 3), 1),
                    power_w=round(70 + util * 5.5, 1),
                    last_xid=xid,
                    ecc_dbe_total=1 if xid == 48 else 0,
                    ecc_sbe_total=rng.randrange(0, 3),
                    mig_devices=slices,
                )
            )
    services.gpu_metrics_record(samples=samples, now=now)
    return {"clusters": len(clusters), "pools": len(DEMO_POOLS), "nodes": sum(p.nodes for p in DEMO_POOLS),
            "gpus": gpu_count}  # fmt: skip
