"""dcgm-exporter's Prometheus text for the simulated GPUs, as the real exporter writes it (contracts §10).

The counters are those of the counters CSV the GPU Operator configures (`dcp-metrics-included.csv`): ECC volatile
totals are commented out there and row-remap pending is not in it at all, so they appear only when the simulator
is told to enable them (a custom CSV). In the default flex mode a GPU with MIG instances has no row of its own:
each instance has rows (`GPU_I_PROFILE`, `GPU_I_ID`) with its own memory and graphics engine activity, repeating
the GPU's device-level fields; `DCGM_FI_DEV_GPU_UTIL` is not supported on MIG and NVML cannot read remapped rows
while MIG is on, so neither appears for a MIG GPU. The XID row carries `err_code` and `err_msg`.

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
_SMALL_BOARDS = {"NVIDIA-A30": 165, "NVIDIA-A100-80GB-PCIe": 300, "NVIDIA-H100-PCIe": 350, "NVIDIA-L4": 72}
# NVML reads remapped rows on Ampere and newer datacenter GPUs only (contracts §10).
REMAP_ARCHITECTURES = frozenset({"ampere", "ada-lovelace", "hopper", "blackwell"})

# (field, type, help as in the CSV, on in the operator's default CSV)
METRICS = (
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", True),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", True),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", True),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", True),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", True),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", True),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.", False),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.", False),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors", True),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors", True),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", True),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending", False),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", True),
)
DEFAULT_COUNTERS = frozenset(name for name, _, _, on in METRICS if on)
OPTIONAL_COUNTERS = frozenset(name for name, _, _, on in METRICS if not on)
# A few texts of the exporter's XID table (its err_msg label); the simulator only raises these.
_XID_TEXT = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    79: "GPU has fallen off the bus",
}


@dataclass(frozen=True)
class Sample:
    labels: str
    values: dict[str, float]  # metric name -> value; what a row does not support is absent
    tail: str = ""  # the workload's namespace and pod, after the XID row's err_code and err_msg


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


def _labels(node: SimNode, gpu: Gpu, device: MigDevice | None, pod: dict | None, host_label: str) -> tuple[str, str]:
    """The row's labels in the exporter's order: the GPU's, the instance's, the host, the driver version label,
    then the pod attributes sorted by name (container, [err_code, err_msg,] namespace, pod)."""
    parts = [
        f'gpu="{gpu.index}"',
        f'UUID="{gpu.uuid}"',
        f'pci_bus_id="{gpu.pci_bus_id}"',
        f'device="nvidia{gpu.index}"',
        f'modelName="{gpu.product.display_name}"',
    ]
    if device is not None:
        parts += [f'GPU_I_PROFILE="{device.profile}"', f'GPU_I_ID="{device.gi_id}"']
    parts += [f'{host_label}="{node.name}"', f'DCGM_FI_DRIVER_VERSION="{node.driver_version}"']
    if pod is None:
        return ",".join(parts), ""
    meta = pod["metadata"]
    parts.append(f'container="{pod["spec"]["containers"][0]["name"]}"')
    return ",".join(parts), f'namespace="{meta["namespace"]}",pod="{meta["name"]}"'


def _device_values(node: SimNode, gpu: Gpu, util: float, xid: int, seed: int) -> dict[str, float]:
    """The GPU's device-level fields: its own row's, or repeated on each of its instance rows."""
    board = _SMALL_BOARDS.get(node.product.name) or _BOARD_WATTS.get(node.product.architecture, 300)
    values = {
        "DCGM_FI_DEV_GPU_TEMP": round(30 + util * 0.45 + _noise(seed, gpu.uuid, "temp") * 6),
        "DCGM_FI_DEV_POWER_USAGE": round(board * (_IDLE_WATTS + (1 - _IDLE_WATTS) * util / 100), 3),
        "DCGM_FI_DEV_XID_ERRORS": xid or gpu.xid,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": gpu.ecc_sbe,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": gpu.ecc_dbe,
    }
    if node.product.architecture in REMAP_ARCHITECTURES and not gpu.mig_enabled:
        values.update(
            {
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": gpu.remapped_uncorrectable,
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": gpu.remapped_correctable,
                "DCGM_FI_DEV_ROW_REMAP_FAILURE": int(gpu.remap_failure),
                "DCGM_FI_DEV_ROW_REMAP_PENDING": int(gpu.remap_pending),
            }
        )
    return values


def node_samples(
    node: SimNode,
    pods: list[dict],
    strategy: str,
    seed: int,
    now: float,
    xid: dict[int, int],
    host_label: str = "hostname",
) -> list[Sample]:
    """One sample per GPU without MIG instances, one per MIG instance on the others."""
    assigned = device_assignments(node, pods, strategy)
    samples = []
    for gpu in node.gpus:
        devices = gpu.mig_devices if gpu.mig_enabled else []
        slices = []
        for device in devices:
            users = assigned.get((gpu.index, device.gi_id), [])
            util = _utilisation(seed, f"{gpu.uuid}/{device.gi_id}", now, len(users))
            memory = node.product.mig_profile(device.profile).memory_mib
            used = _memory_used(seed, f"{gpu.uuid}/{device.gi_id}", now, memory, bool(users))
            slices.append((device, users, util, memory, used))
        if slices:
            util = sum(u * d.size for d, _, u, _, _ in slices) / sum(d.size for d, _, _, _, _ in slices)
            device_values = _device_values(node, gpu, util, xid.get(gpu.index, 0), seed)
            for device, users, util, memory, used in slices:
                values = {
                    **device_values,
                    "DCGM_FI_DEV_FB_USED": used,
                    "DCGM_FI_DEV_FB_FREE": memory - used,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util / 100, 4),
                }
                labels, tail = _labels(node, gpu, device, users[0] if users else None, host_label)
                samples.append(Sample(labels, values, tail))
            continue
        users = assigned.get((gpu.index, None), [])
        util = _utilisation(seed, gpu.uuid, now, len(users))
        used = _memory_used(seed, gpu.uuid, now, gpu.product.memory_mib, util > 10)
        values = {
            **_device_values(node, gpu, util, xid.get(gpu.index, 0), seed),
            "DCGM_FI_DEV_FB_USED": used,
            "DCGM_FI_DEV_FB_FREE": gpu.product.memory_mib - used,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(util / 100, 4),
        }
        if not gpu.mig_enabled:  # not supported while MIG mode is on, even with no instance
            values["DCGM_FI_DEV_GPU_UTIL"] = round(util, 1)
        labels, tail = _labels(node, gpu, None, users[0] if users else None, host_label)
        samples.append(Sample(labels, values, tail))
    return samples


def _utilisation(seed: int, key: str, now: float, users: int) -> float:
    drift = _smooth(seed, key, now)
    if users == 0:
        return round(drift * 3, 1)
    return round(min(100.0, 50 + 30 * drift + 10 * users), 1)


def _memory_used(seed: int, key: str, now: float, total: int, busy: bool) -> int:
    fraction = 0.35 + 0.55 * _smooth(seed, key + "/fb", now) if busy else 0.005
    return int(total * fraction)


def render(samples: list[Sample], counters: frozenset[str] = DEFAULT_COUNTERS) -> Iterator[str]:
    """Prometheus text exposition of the enabled counters, grouped by metric as dcgm-exporter writes it."""
    for name, kind, help_text, _ in METRICS:
        if name not in counters:
            continue
        yield f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
        yield "".join(
            f"{name}{{{_row_labels(name, s)}}} {_format(s.values[name])}\n" for s in samples if name in s.values
        )


def _row_labels(name: str, sample: Sample) -> str:
    labels = sample.labels
    if name == "DCGM_FI_DEV_XID_ERRORS":
        code = int(sample.values[name])
        labels += f',err_code="{code}",err_msg="{_XID_TEXT.get(code, "Unknown Error")}"'
    return f"{labels},{sample.tail}" if sample.tail else labels


def _format(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
