"""dcgm-exporter's Prometheus text for the simulated GPUs (contracts §10).

Values are a function of (seed, GPU, time): they move smoothly, repeat for the same seed and moment, and
GPUs (or MIG devices) that pods hold run hot. GPU identities (UUID, PCI bus id) are exposed only here, as on
a real cluster, where GFD publishes none of them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sharing.render import GPU_RESOURCE
from simulator.fleet import Gpu, MigDevice, SimNode
from simulator.workload import gpu_requests, holds_gpu

_BUCKET_SECONDS = 15.0
_IDLE_WATTS = 0.12  # fraction of the board power an idle GPU draws
_BOARD_WATTS = {"ampere": 400, "hopper": 700, "blackwell": 1000, "ada-lovelace": 72, "turing": 70}
_SMALL_BOARDS = {"NVIDIA-A30": 165, "NVIDIA-A100-80GB-PCIe": 300, "NVIDIA-H100-PCIe": 350, "NVIDIA-L40S": 350}

METRICS = (
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
)


@dataclass(frozen=True)
class Sample:
    labels: str
    values: dict[str, float]  # metric name -> value; device-level metrics are absent on MIG devices


def _noise(*parts: object) -> float:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _smooth(seed: int, key: str, now: float) -> float:
    """A value in [0, 1) that drifts between random points every 15 s (cosine-interpolated)."""
    bucket, frac = divmod(now / _BUCKET_SECONDS, 1.0)
    a, b = _noise(seed, key, int(bucket)), _noise(seed, key, int(bucket) + 1)
    weight = (1 - math.cos(frac * math.pi)) / 2
    return a + (b - a) * weight


def device_assignments(node: SimNode, pods: Iterable[dict], strategy: str) -> dict[tuple[int, int | None], list[dict]]:
    """Which pods use which GPU (gi_id None) or MIG device, least-loaded first, as the kubelet would spread them."""
    whole = [(gpu.index, None) for gpu in node.gpus if not gpu.mig_enabled]
    if strategy == "single" and any(gpu.mig_enabled for gpu in node.gpus):
        whole = [(gpu.index, d.gi_id) for gpu in node.gpus for d in gpu.mig_devices]
    by_resource: dict[str, list[tuple[int, int | None]]] = {GPU_RESOURCE: whole}
    for gpu in node.gpus:
        for device in gpu.mig_devices if gpu.mig_enabled else ():
            resource = node.product.mig_profile(device.profile).resource_name
            by_resource.setdefault(resource, []).append((gpu.index, device.gi_id))
    load: dict[tuple[int, int | None], list[dict]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if not holds_gpu(pod):
            continue
        for resource, count in gpu_requests(pod).items():
            candidates = by_resource.get(resource.removesuffix(".shared"), [])
            for device in sorted(candidates, key=lambda d: len(load.get(d, [])))[:count]:
                load.setdefault(device, []).append(pod)
    return load


def _labels(node: SimNode, gpu: Gpu, device: MigDevice | None, pod: dict | None) -> str:
    parts = [
        f'gpu="{gpu.index}"',
        f'UUID="{gpu.uuid}"',
        f'pci_bus_id="{gpu.pci_bus_id}"',
        f'device="nvidia{gpu.index}"',
        f'modelName="{gpu.product.display_name}"',
    ]
    if device is not None:
        parts += [f'GPU_I_PROFILE="{device.profile}"', f'GPU_I_ID="{device.gi_id}"']
    parts += [f'Hostname="{node.name}"', f'DCGM_FI_DRIVER_VERSION="{node.driver_version}"']
    if pod is not None:
        meta = pod["metadata"]
        parts += [f'container="{pod["spec"]["containers"][0]["name"]}"', f'namespace="{meta["namespace"]}"']
        parts.append(f'pod="{meta["name"]}"')
    return ",".join(parts)


def node_samples(node: SimNode, pods: list[dict], strategy: str, seed: int, now: float, xid: dict[int, int]) -> list:
    """One sample per GPU, plus one per MIG device on MIG-enabled GPUs."""
    assigned = device_assignments(node, pods, strategy)
    board = _SMALL_BOARDS.get(node.product.name) or _BOARD_WATTS.get(node.product.architecture, 300)
    samples = []
    for gpu in node.gpus:
        devices = gpu.mig_devices if gpu.mig_enabled else []
        utils = []
        for device in devices:
            users = assigned.get((gpu.index, device.gi_id), [])
            util = _utilisation(seed, f"{gpu.uuid}/{device.gi_id}", now, len(users))
            utils.append((util, device.size))
            memory = node.product.mig_profile(device.profile).memory_mib
            used = _memory_used(seed, f"{gpu.uuid}/{device.gi_id}", now, memory, bool(users))
            values = {
                "DCGM_FI_DEV_GPU_UTIL": util,
                "DCGM_FI_DEV_FB_USED": used,
                "DCGM_FI_DEV_FB_FREE": memory - used,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util / 100, 4),
            }
            samples.append(Sample(_labels(node, gpu, device, users[0] if users else None), values))
        users = assigned.get((gpu.index, None), [])
        if utils:
            util = sum(u * size for u, size in utils) / max(1, sum(size for _, size in utils))
        else:
            util = _utilisation(seed, gpu.uuid, now, len(users))
        used = _memory_used(seed, gpu.uuid, now, gpu.product.memory_mib, util > 10)
        temp = 30 + util * 0.45 + _noise(seed, gpu.uuid, "temp") * 6
        power = board * (_IDLE_WATTS + (1 - _IDLE_WATTS) * util / 100)
        values = {
            "DCGM_FI_DEV_GPU_UTIL": round(util, 1),
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_FREE": gpu.product.memory_mib - used,
            "DCGM_FI_DEV_GPU_TEMP": round(temp),
            "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
            "DCGM_FI_DEV_XID_ERRORS": xid.get(gpu.index) or gpu.xid,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": gpu.ecc_sbe,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": gpu.ecc_dbe,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util / 100, 4),
        }
        samples.append(Sample(_labels(node, gpu, None, users[0] if users else None), values))
    return samples


def _utilisation(seed: int, key: str, now: float, users: int) -> float:
    drift = _smooth(seed, key, now)
    if users == 0:
        return round(drift * 3, 1)
    return round(min(100.0, 50 + 30 * drift + 10 * users), 1)


def _memory_used(seed: int, key: str, now: float, total: int, busy: bool) -> int:
    fraction = 0.35 + 0.55 * _smooth(seed, key + "/fb", now) if busy else 0.005
    return int(total * fraction)


def render(samples: list[Sample]) -> Iterator[str]:
    """Prometheus text exposition, grouped by metric as dcgm-exporter writes it."""
    for name, kind, help_text in METRICS:
        yield f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
        yield "".join(f"{name}{{{s.labels}}} {_format(s.values[name])}\n" for s in samples if name in s.values)


def _format(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
