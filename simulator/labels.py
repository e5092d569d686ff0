"""What GPU Feature Discovery labels and the device plugin advertises, from a node's GPUs (contracts §3.5, §3.6)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from sharing.render import GPU_RESOURCE, DevicePluginSpec
from simulator.fleet import SimNode

_SHARING_LABEL = {None: "none", "time_slicing": "time-slicing", "mps": "mps"}
# Label prefixes GFD owns; everything else under nvidia.com/ (deploy labels, mig.config, ...) belongs to others.
_GFD_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/cuda.", "nvidia.com/mig-", "nvidia.com/gfd.", "nvidia.com/vgpu.")
_GFD_KEYS = frozenset({"nvidia.com/mig.capable", "nvidia.com/mig.strategy", "nvidia.com/mps.capable"})
_NOT_GFD = ("nvidia.com/gpu.deploy.", "nvidia.com/gpu.present")


def is_gfd_label(key: str) -> bool:
    if key.startswith(_NOT_GFD):
        return False
    return key in _GFD_KEYS or key.startswith(_GFD_PREFIXES)


def is_gpu_resource(name: str) -> bool:
    return name.startswith(("nvidia.com/gpu", "nvidia.com/mig-"))


@dataclass(frozen=True)
class Advertised:
    """The device plugin's view of a node: resources, or why it refuses to start."""

    resources: dict[str, int]
    error: str | None = None
    single_profile: str | None = None  # under `single`: the one MIG profile every device has


def _mig_counts(node: SimNode) -> Counter:
    return Counter(device.profile for gpu in node.gpus if gpu.mig_enabled for device in gpu.mig_devices)


def advertised(node: SimNode, spec: DevicePluginSpec, strategy: str) -> Advertised:
    """Resource names and counts by MIG strategy, then multiplied by sharing replicas (§3.2, §3.5)."""
    if spec.sharing == "mps" and strategy == "mixed":
        # Checked with the flags at start-up, before any GPU is looked at: the plugin exits (§3.3, main.go).
        return Advertised({}, "using --mig-strategy=mixed is not supported with MPS")
    mig_gpus = [gpu for gpu in node.gpus if gpu.mig_enabled]
    single_profile = None
    if strategy == "mixed":
        base = {GPU_RESOURCE: len(node.gpus) - len(mig_gpus)} if len(mig_gpus) < len(node.gpus) else {}
        for profile, count in sorted(_mig_counts(node).items()):
            base[node.product.mig_profile(profile).resource_name] = count
    elif strategy == "single" and mig_gpus:
        layouts = {tuple(sorted(d.profile for d in gpu.mig_devices)) for gpu in mig_gpus}
        profiles = {device.profile for gpu in mig_gpus for device in gpu.mig_devices}
        if len(mig_gpus) != len(node.gpus):
            return Advertised({}, "all devices on the node must be configured with the same migEnabled value")
        if len(profiles) != 1 or len(layouts) != 1:
            return Advertised({}, "invalid MIG configuration: all MIG devices must be of the same type")
        single_profile = profiles.pop()
        base = {GPU_RESOURCE: sum(len(gpu.mig_devices) for gpu in mig_gpus)}
    else:
        base = {GPU_RESOURCE: len(node.gpus)}
    if spec.sharing is None:
        return Advertised(base, None, single_profile)
    if spec.sharing == "mps" and mig_gpus and strategy != "none":
        return Advertised({}, "sharing using MPS is not supported for MIG devices")  # contracts §3.3
    resources = {}
    for name, count in base.items():
        if name in spec.resources:
            resources[f"{name}.shared" if spec.rename_by_default else name] = count * spec.replicas
        else:
            resources[name] = count
    return Advertised(resources, None, single_profile)


def gfd_labels(node: SimNode, spec: DevicePluginSpec, strategy: str, plugin: Advertised) -> dict[str, str]:
    product = node.product
    driver = node.driver_version.split(".")
    cuda_major, cuda_minor = node.cuda_version.split(".")
    shared = spec.sharing is not None
    gpu_shared = shared and GPU_RESOURCE in spec.resources
    labels = {
        "nvidia.com/gpu.product": product.name,
        "nvidia.com/gpu.count": str(len(node.gpus)),
        "nvidia.com/gpu.memory": str(product.memory_mib),
        "nvidia.com/gpu.family": product.architecture,
        "nvidia.com/gpu.compute.major": str(product.compute_capability[0]),
        "nvidia.com/gpu.compute.minor": str(product.compute_capability[1]),
        "nvidia.com/gpu.machine": f"SIM-{len(node.gpus)}GPU-SERVER",
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.replicas": str(spec.replicas if gpu_shared else 1),
        "nvidia.com/gpu.sharing-strategy": _SHARING_LABEL[spec.sharing] if gpu_shared else "none",
        "nvidia.com/cuda.driver-version.major": driver[0],
        "nvidia.com/cuda.driver-version.minor": driver[1],
        "nvidia.com/cuda.driver-version.revision": driver[2],
        "nvidia.com/cuda.driver-version.full": node.driver_version,
        "nvidia.com/cuda.driver.major": driver[0],
        "nvidia.com/cuda.driver.minor": driver[1],
        "nvidia.com/cuda.driver.rev": driver[2],
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.full": node.cuda_version,
        "nvidia.com/cuda.runtime.major": cuda_major,
        "nvidia.com/cuda.runtime.minor": cuda_minor,
        "nvidia.com/mig.capable": "true" if product.mig_capable else "false",
        "nvidia.com/mps.capable": "true" if spec.sharing == "mps" and plugin.error is None else "false",
        "nvidia.com/vgpu.present": "false",
        "nvidia.com/gfd.timestamp": str(int(time.time())),
    }
    if product.mig_capable:
        labels["nvidia.com/mig.strategy"] = strategy
    mig_gpus = [gpu for gpu in node.gpus if gpu.mig_enabled]
    if strategy == "single" and mig_gpus:
        if plugin.single_profile is None:
            labels["nvidia.com/gpu.product"] = f"{product.name}-MIG-INVALID"
        else:
            profile = product.mig_profile(plugin.single_profile)
            labels.update(
                {
                    "nvidia.com/gpu.product": f"{product.name}-MIG-{profile.name}",
                    "nvidia.com/gpu.count": str(sum(len(gpu.mig_devices) for gpu in mig_gpus)),
                    "nvidia.com/gpu.memory": str(profile.memory_mib),
                    "nvidia.com/gpu.multiprocessors": str(profile.multiprocessors),
                    "nvidia.com/gpu.slices.gi": str(profile.compute_slices),
                    "nvidia.com/gpu.slices.ci": str(profile.compute_slices),
                }
            )
    elif strategy == "mixed":
        if len(mig_gpus) == len(node.gpus):
            labels["nvidia.com/gpu.replicas"] = "0"  # as in NVIDIA's mixed sample (contracts §3.6)
        for name, count in sorted(_mig_counts(node).items()):
            profile = product.mig_profile(name)
            key = profile.resource_name
            mig_shared = shared and key in spec.resources
            labels.update(
                {
                    f"{key}.count": str(count),
                    f"{key}.memory": str(profile.memory_mib),
                    f"{key}.multiprocessors": str(profile.multiprocessors),
                    f"{key}.slices.gi": str(profile.compute_slices),
                    f"{key}.slices.ci": str(profile.compute_slices),
                    f"{key}.product": f"{product.name}-MIG-{profile.name.replace('+', '.')}"
                    + ("-SHARED" if mig_shared and not spec.rename_by_default else ""),
                    f"{key}.replicas": str(spec.replicas if mig_shared else 1),
                    f"{key}.sharing-strategy": _SHARING_LABEL[spec.sharing] if mig_shared else "none",
                }
            )
    if gpu_shared and not spec.rename_by_default:
        labels["nvidia.com/gpu.product"] += "-SHARED"  # contracts §3.6
    return labels
