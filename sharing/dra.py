"""NVIDIA's DRA driver as Tessera reads it: pools of `gpu.nvidia.com` ResourceSlices and which GPU stack a node runs.

Pure (no Django, no I/O): the simulator and the worker share it. Facts and their upstream files:
docs/nvidia-contracts.md §13 (pool = node name, newest complete generation, the plugin's labels and FEATURE_GATES).
"""

from __future__ import annotations

from dataclasses import dataclass

DRIVER = "gpu.nvidia.com"
# The kubelet plugin's pods: the driver's Helm chart and the GPU Operator's GPUCluster label them differently (§13.3).
HELM_PLUGIN_SELECTOR = "dra-driver-nvidia-gpu-component=kubelet-plugin"
OPERATOR_PLUGIN_SELECTOR = "app=nvidia-dra-driver-kubelet-plugin"

# Node.gpu_stack values (fleet.choices.GpuStack names them for people).
DEVICE_PLUGIN = "device_plugin"
DRA_CLUSTER_POLICY = "dra_clusterpolicy"
DRA_GPU_CLUSTER = "dra_gpucluster"


def pool_key(slice_obj: dict) -> tuple[str, str]:
    spec = slice_obj.get("spec") or {}
    return spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")


def newest_complete(slices: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(driver, pool) -> the pool's slices at its highest generation, only once all `resourceSliceCount` of them are
    there (what the scheduler uses; older generations are obsolete, §13.2)."""
    pools: dict[tuple[str, str], list[dict]] = {}
    for s in slices:
        pools.setdefault(pool_key(s), []).append(s)
    complete = {}
    for key, members in pools.items():
        top = max(_generation(m) for m in members)
        newest = [m for m in members if _generation(m) == top]
        wanted = max(int((m["spec"].get("pool") or {}).get("resourceSliceCount", 1)) for m in newest)
        if len({m["metadata"]["name"] for m in newest}) >= wanted:
            complete[key] = newest
    return complete


def _generation(slice_obj: dict) -> int:
    return int(((slice_obj.get("spec") or {}).get("pool") or {}).get("generation", 0))


def parse_feature_gates(text: str) -> dict[str, bool]:
    """The plugin's FEATURE_GATES env (`Name=true,Other=false,`, as the chart and the operator render it)."""
    gates = {}
    for item in (text or "").split(","):
        name, _, value = item.strip().partition("=")
        if name:
            gates[name] = value.strip().lower() == "true"
    return gates


def plugin_feature_gates(pod: dict) -> dict[str, bool]:
    """FEATURE_GATES of the plugin pod's containers (the `gpus` container's win)."""
    gates: dict[str, bool] = {}
    containers = sorted((pod.get("spec") or {}).get("containers") or [], key=lambda c: c.get("name") == "gpus")
    for container in containers:
        for env in container.get("env") or []:
            if env.get("name") == "FEATURE_GATES":
                gates.update(parse_feature_gates(env.get("value", "")))
    return gates


def uses_counters(slices: list[dict]) -> bool:
    """DynamicMIG publishes shared counters and devices that consume them (§13, partitions.go); static mode never."""
    return any(
        (s.get("spec") or {}).get("sharedCounters")
        or any(d.get("consumesCounters") for d in (s.get("spec") or {}).get("devices") or [])
        for s in slices
    )


def node_stack(
    *,
    labels: dict,
    allocatable: dict,
    slices: list[dict],
    plugin_pod: dict | None,
    gpu_cluster: dict | None,
) -> tuple[str, bool | None]:
    """(gpu stack, DynamicMIG on) of one node from what the cluster shows: its `gpu.nvidia.com` pool (newest
    complete generation), its DRA kubelet-plugin pod, the cluster's GPUCluster, else the device plugin's deploy label
    and resources. ("", None) when nothing says. DynamicMIG is None on device-plugin nodes (no such thing there)."""
    if slices or plugin_pod is not None:
        operator_pod = (
            plugin_pod is not None
            and (plugin_pod["metadata"].get("labels") or {}).get("app") == (OPERATOR_PLUGIN_SELECTOR.split("=", 1)[1])
        )
        stack = DRA_GPU_CLUSTER if gpu_cluster is not None or operator_pod else DRA_CLUSTER_POLICY
        gates = plugin_feature_gates(plugin_pod) if plugin_pod is not None else {}
        if not gates and gpu_cluster is not None:
            spec = (gpu_cluster.get("spec") or {}).get("draDriver") or {}
            gates = {k: bool(v) for k, v in (spec.get("featureGates") or {}).items()}
        return stack, bool(gates.get("DynamicMIG")) or uses_counters(slices)
    deploy = labels.get("nvidia.com/gpu.deploy.device-plugin")
    if deploy in ("true", "paused-for-mig-change") or any(k.startswith("nvidia.com/") for k in allocatable):
        return DEVICE_PLUGIN, None
    return "", None


# -- inventory: GPUs and MIG devices of a pool ------------------------------------------------------------------------

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity_mib(text: str) -> int:
    """A byte quantity ("81559Mi", "85520809984", "80Gi") in MiB, rounded down; 0 when unreadable."""
    text = str(text or "").strip()
    for suffix, factor in _BINARY.items():
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * factor // 2**20
    return int(text) // 2**20 if text.isdigit() else 0


@dataclass(frozen=True)
class DraMig:
    device: str  # the slice's device name: gpu-<minor>-mig-<profile>-<GI profile id>-<start>
    profile: str
    start: int
    size: int  # memory slices held (memorySlice<i> capacities)
    uuid: str
    memory_mib: int


@dataclass(frozen=True)
class DraGpu:
    minor: int
    uuid: str
    product_name: str  # NVML's, as the productName attribute carries it
    memory_mib: int  # 0 when the pool shows only its MIG devices
    pci_bus_id: str
    device: str  # gpu-<minor>; "" when MIG mode is on (the parent is not published)
    migs: tuple[DraMig, ...] = ()


def _attr(device: dict, key: str) -> str:
    value = (device.get("attributes") or {}).get(key) or {}
    return str(next(iter(value.values()), "")) if value else ""


def pool_gpus(slices: list[dict]) -> list[DraGpu]:
    """The physical GPUs of a pool's slices (its newest complete generation), by minor: whole GPUs as published, MIG
    GPUs rebuilt from their MIG devices (parentUUID, the minor and start in the device name, the memorySlice
    capacities). DynamicMIG's candidate devices (no uuid: not created) are not instances and are left out."""
    whole: dict[str, DraGpu] = {}
    migs: dict[str, list[tuple[int, DraMig, dict]]] = {}
    for s in slices:
        if (s.get("spec") or {}).get("driver") != DRIVER:
            continue
        for device in (s.get("spec") or {}).get("devices") or []:
            name, kind = device.get("name", ""), _attr(device, "type")
            capacity = device.get("capacity") or {}
            if kind == "gpu" and _attr(device, "uuid"):
                whole[_attr(device, "uuid")] = DraGpu(
                    minor=int(name.split("-")[1]) if name.split("-")[1:2] and name.split("-")[1].isdigit() else 0,
                    uuid=_attr(device, "uuid"),
                    product_name=_attr(device, "productName"),
                    memory_mib=quantity_mib((capacity.get("memory") or {}).get("value")),
                    pci_bus_id=_attr(device, "resource.kubernetes.io/pciBusID"),
                    device=name,
                )
            elif kind == "mig" and _attr(device, "uuid") and _attr(device, "parentUUID"):
                parts = name.split("-")
                slices_held = [k for k in capacity if k.startswith("memorySlice")]
                mig = DraMig(
                    device=name,
                    profile=_attr(device, "profile"),
                    start=int(parts[-1]) if parts[-1].isdigit() else 0,
                    size=len(slices_held) or 1,
                    uuid=_attr(device, "uuid"),
                    memory_mib=quantity_mib((capacity.get("memory") or {}).get("value")),
                )
                minor = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
                migs.setdefault(_attr(device, "parentUUID"), []).append((minor, mig, device))
    gpus = list(whole.values())
    for parent, members in migs.items():
        minor, _, first = members[0]
        gpus.append(
            DraGpu(
                minor=minor,
                uuid=parent,
                product_name=_attr(first, "productName"),
                memory_mib=0,
                pci_bus_id=_attr(first, "resource.kubernetes.io/pciBusID"),
                device="",
                migs=tuple(sorted((m for _, m, _ in members), key=lambda m: m.start)),
            )
        )
    return sorted(gpus, key=lambda g: g.minor)


def device_key(pool: str, device: str) -> str:
    """How Tessera stores a DRA device's identity: driver/pool/device (what a claim's allocation result names)."""
    return f"{DRIVER}/{pool}/{device}"


# -- who holds what: ResourceClaims ------------------------------------------------------------------------------------


def claim_holdings(claims: list[dict], resource_of: dict[str, str]) -> dict[str, dict[str, int]]:
    """Pod uid -> the GPU resources its claims hold, named as the device plugin would advertise them
    (`resource_of`: driver/pool/device -> `nvidia.com/gpu` or `nvidia.com/mig-<profile>`), so previews, demand and
    GPU-hours count DRA pods as they count device-plugin ones. A claim shared by several pods counts for each;
    devices Tessera does not know (another driver, a pool not yet read) are left out."""
    held: dict[str, dict[str, int]] = {}
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        resources: dict[str, int] = {}
        for result in results:
            name = resource_of.get(f"{result.get('driver')}/{result.get('pool')}/{result.get('device')}")
            if name:
                resources[name] = resources.get(name, 0) + 1
        if not resources:
            continue
        for consumer in status.get("reservedFor") or []:
            if consumer.get("resource") == "pods" and consumer.get("uid"):
                mine = held.setdefault(consumer["uid"], {})
                for name, count in resources.items():
                    mine[name] = mine.get(name, 0) + count
    return held


def pool_resources(slices: list[dict]) -> dict[str, int]:
    """A pool's devices counted under the names the device plugin would advertise (`nvidia.com/gpu`,
    `nvidia.com/mig-<profile>`), so a rollout verifies a DRA node against the same expected resources."""
    counts: dict[str, int] = {}
    for gpu in pool_gpus(slices):
        names = ["nvidia.com/mig-" + m.profile.replace("+", ".") for m in gpu.migs] if gpu.migs else ["nvidia.com/gpu"]
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return counts


def requested_resources(claim_specs: list[dict]) -> dict[str, int]:
    """What claims not yet allocated ask, as demand: whole GPUs of the chart's `gpu.nvidia.com` class (`exactly`,
    ExactCount) as `nvidia.com/gpu`. Other classes (MIG by selector, other drivers) say no profile: not counted."""
    wanted: dict[str, int] = {}
    for spec in claim_specs:
        for request in ((spec or {}).get("devices") or {}).get("requests") or []:
            exactly = request.get("exactly") or {}
            if exactly.get("deviceClassName") == DRIVER and exactly.get("allocationMode", "ExactCount") == "ExactCount":
                wanted["nvidia.com/gpu"] = wanted.get("nvidia.com/gpu", 0) + int(exactly.get("count", 1))
    return wanted
