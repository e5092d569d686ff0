"""NVIDIA's DRA driver as Tessera reads it: pools of `gpu.nvidia.com` ResourceSlices and which GPU stack a node runs.

Pure (no Django, no I/O): the simulator and the worker share it. Facts and their upstream files:
docs/nvidia-contracts.md §13 (pool = node name, newest complete generation, the plugin's labels and FEATURE_GATES).
"""

from __future__ import annotations

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
