"""The simulated hardware: nodes and their GPUs, generated deterministically from a seed.

Node i depends only on (seed, i), so a fleet of 10 nodes is the first 10 nodes of a fleet of 10,000.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field

from sharing.mig import GpuProduct, get_product
from simulator.ids import stable_uuid

# Share of nodes by (product, GPUs per node): mostly 8-GPU H100 / A100 servers, a tail of smaller parts.
PRODUCT_MIX: tuple[tuple[str, int, float], ...] = (
    ("NVIDIA-H100-80GB-HBM3", 8, 0.40),
    ("NVIDIA-A100-SXM4-80GB", 8, 0.25),
    ("NVIDIA-A100-SXM4-40GB", 8, 0.04),
    ("NVIDIA-A30", 4, 0.08),
    ("NVIDIA-L4", 4, 0.09),
    ("Tesla-T4", 4, 0.07),
    ("NVIDIA-H200", 8, 0.04),
    ("NVIDIA-B200", 8, 0.01),
    # Last, so that adding them moved no earlier node's product: the newest parts of the MIG catalog (§4).
    ("NVIDIA-GH200-480GB", 4, 0.01),
    ("NVIDIA-B300-SXM6-AC", 8, 0.01),
)

# The newest parts start with MIG on, so that the demo draws their layouts (they are rare in the mix).
_SHOWN_SLICED = frozenset({"NVIDIA-GH200-480GB", "NVIDIA-B300-SXM6-AC"})

# PCI bus numbers of GPUs in common 8- and 4-GPU servers (DGX-style / 4-slot PCIe).
_BUSES = {8: (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB), 4: (0x17, 0x65, 0xCA, 0xE3)}
# Driver branches in use, with the CUDA version each reports; Blackwell needs R570 (contracts §4).
_DRIVERS = (("550.127.05", "12.4"), ("535.216.01", "12.2"), ("570.133.20", "12.8"))
_INSTANCE_TYPES = {8: "gpu-8x", 4: "gpu-4x"}
ZONES = ("zone-a", "zone-b", "zone-c")


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (GPU instance with a full-size compute instance) as mig-parted creates it."""

    profile: str
    start: int
    size: int
    gi_id: int
    parent_uuid: str
    generation: int  # the node's reconfiguration count: a re-created device gets a new UUID

    @property
    def uuid(self) -> str:
        return "MIG-" + stable_uuid(self.parent_uuid, self.generation, self.start, self.profile)

    def describe(self) -> dict:
        return {"profile": self.profile, "start": self.start, "size": self.size, "gi_id": self.gi_id, "uuid": self.uuid}


@dataclass
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    product: GpuProduct
    mig_enabled: bool = False
    mig_devices: list[MigDevice] = field(default_factory=list)
    xid: int = 0  # last XID error (dcgm-exporter DCGM_FI_DEV_XID_ERRORS)
    ecc_dbe: int = 0
    ecc_sbe: int = 0
    # Row remapping (Ampere and later): rows remapped after uncorrectable / correctable errors, a remap waiting for
    # a reset, a remap that failed.
    remapped_uncorrectable: int = 0
    remapped_correctable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False


@dataclass
class SimNode:
    """A GPU server: hardware plus what its Kubernetes node reports about itself."""

    index: int
    name: str
    product: GpuProduct
    gpus: list[Gpu]
    cpu: int
    memory_gib: int
    internal_ip: str
    zone: str
    driver_version: str
    cuda_version: str
    ready: bool = True
    cordoned: bool = False
    initial_mig_config: str | None = None  # what the node's mig.config label names at start (MIG-capable only)
    initial_plugin_config: str | None = None  # nvidia.com/device-plugin.config at start
    mig_applies: int = 0  # how many reconfigurations ran; part of MIG device UUIDs (they change on re-create)
    # The kubelet settings a QoS policy compares (contracts §7.2), served at /api/v1/nodes/<name>/proxy/configz.
    kubelet: dict[str, str] = field(default_factory=dict)

    def state(self) -> dict:
        """What changes while the node runs (readiness, MIG layout and reconfiguration count, kubelet settings); the
        rest is a function of (seed, index) and is generated again at a restart."""
        return {
            "ready": self.ready,
            "mig_applies": self.mig_applies,
            "kubelet": dict(self.kubelet),
            "gpus": [
                {
                    "mig_enabled": gpu.mig_enabled,
                    "mig_devices": [[d.profile, d.start, d.size, d.gi_id, d.generation] for d in gpu.mig_devices],
                }
                for gpu in self.gpus
            ],
        }

    def restore(self, state: dict) -> None:
        self.ready, self.mig_applies, self.kubelet = state["ready"], state["mig_applies"], dict(state["kubelet"])
        for gpu, saved in zip(self.gpus, state["gpus"], strict=True):
            gpu.mig_enabled = saved["mig_enabled"]
            gpu.mig_devices = [MigDevice(p, s, z, gi, gpu.uuid, gen) for p, s, z, gi, gen in saved["mig_devices"]]


# (share, topologyManagerPolicy, cpuManagerPolicy): most kubelets run the defaults, tuned nodes align to NUMA.
KUBELET_MIX: tuple[tuple[float, str, str], ...] = (
    (0.70, "none", "none"),
    (0.15, "single-numa-node", "static"),
    (0.10, "best-effort", "none"),
    (0.05, "restricted", "static"),
)


def kubelet_settings(seed: int, index: int) -> dict[str, str]:
    """The node's kubelet policies; a generator of their own keeps every other draw of the node as it was."""
    draw = random.Random(f"{seed}:kubelet:{index}").random()
    total, chosen = 0.0, KUBELET_MIX[0]
    for entry in KUBELET_MIX:
        total += entry[0]
        if draw < total:
            chosen = entry
            break
    return {"topologyManagerPolicy": chosen[1], "topologyManagerScope": "container", "cpuManagerPolicy": chosen[2]}


@functools.lru_cache(maxsize=16)
def _mix_offset(seed: int) -> float:
    return random.Random(f"{seed}:mix").random()


def _pick_product(seed: int, index: int) -> tuple[str, int]:
    """A golden-ratio sequence from a seeded offset: any run of nodes follows the mix closely, even 10 nodes."""
    point = (_mix_offset(seed) + index * 0.6180339887498949) % 1.0
    total = 0.0
    for name, count, share in PRODUCT_MIX:
        total += share
        if point < total:
            return name, count
    return PRODUCT_MIX[0][0], PRODUCT_MIX[0][1]


def generate_node(seed: int, index: int) -> SimNode:
    rng = random.Random(f"{seed}:node:{index}")
    product_name, gpu_count = _pick_product(seed, index)
    product = get_product(product_name)
    name = f"gpu-node-{index + 1:04d}"
    gpus = [
        Gpu(i, "GPU-" + stable_uuid(seed, name, i), f"00000000:{bus:02X}:00.0", product)
        for i, bus in enumerate(_BUSES[gpu_count])
    ]
    if rng.random() < 0.006:  # a few GPUs in trouble: fell off the bus, or double-bit ECC errors
        sick = rng.choice(gpus)
        if rng.random() < 0.5:
            sick.xid = 79
        else:
            sick.xid, sick.ecc_dbe, sick.ecc_sbe = 48, rng.randint(1, 4), rng.randint(10, 500)
            # On Ampere and later an uncorrectable error remaps its row, which takes effect at the next reset.
            sick.remapped_uncorrectable, sick.remap_pending = sick.ecc_dbe, True
    _wear(seed, index, gpus)
    driver, cuda = _DRIVERS[2] if product.architecture == "blackwell" else rng.choice(_DRIVERS)
    big = gpu_count == 8
    host, subnet = (index + 1) % 250 + 2, (index + 1) // 250
    mig_config = plugin_config = None
    if product.mig_capable:
        # Some MIG-capable nodes already run MIG; the operator labels the others all-disabled (contracts §1.1).
        draw = rng.random()
        smallest = min(product.profiles, key=lambda p: (p.memory_slices, p.media_extensions, -p.max_count))
        mig_config = "all-balanced" if draw < 0.15 else f"all-{smallest.name}" if draw < 0.25 else "all-disabled"
        if product_name in _SHOWN_SLICED:
            mig_config = "all-balanced"
    elif rng.random() < 0.4:
        plugin_config = "time-sliced-4"
    return SimNode(
        index=index,
        name=name,
        product=product,
        gpus=gpus,
        cpu=224 if big else 64,
        memory_gib=2048 if big else 512,
        internal_ip=f"10.{subnet // 256 % 256}.{subnet % 256}.{host}",
        zone=ZONES[index % len(ZONES)],
        driver_version=driver,
        cuda_version=cuda,
        ready=rng.random() >= 0.01,
        cordoned=rng.random() < 0.02,
        initial_mig_config=mig_config,
        initial_plugin_config=plugin_config,
        kubelet=kubelet_settings(seed, index),
    )


def _wear(seed: int, index: int, gpus: list[Gpu]) -> None:
    """Rows remapped after correctable errors on a few GPUs, and now and then a remap that failed (XID 64); drawn
    from a generator of their own so every other draw of the node stays what it was."""
    rng = random.Random(f"{seed}:wear:{index}")
    for gpu in gpus:
        if rng.random() < 0.02:
            gpu.remapped_correctable = rng.randint(1, 6)
    if rng.random() < 0.002:
        failed = rng.choice(gpus)
        failed.remap_failure, failed.xid = True, failed.xid or 64


def instance_type(node: SimNode) -> str:
    return f"{_INSTANCE_TYPES[len(node.gpus)]}-{node.product.name.lower()}"
