"""Label keys and small readers of Node objects (raw JSON dicts), shared by the driver and the inventory sync."""

from datetime import datetime

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_NODE_SELECTOR = f"{GPU_PRESENT}=true"
MANAGED = "tessera.io/managed"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_TESSERA = "tessera"
MIG_STATES = ("pending", "rebooting", "success", "failed")
TERMINAL_POD_PHASES = ("Succeeded", "Failed")


def is_gpu_resource(name: str) -> bool:
    """Extended resources of NVIDIA's device plugin: nvidia.com/gpu(.shared) and nvidia.com/mig-* (§3.5)."""
    return name.startswith(("nvidia.com/gpu", "nvidia.com/mig-"))


def instant(text: str | None) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339, "2025-03-01T08:00:00Z"); None when absent or unreadable."""
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def quantity(value) -> int:
    """An extended-resource quantity as an int (they are whole numbers; "1k" style suffixes do not occur)."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def gpu_allocatable(node: dict) -> dict[str, int]:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {k: quantity(v) for k, v in sorted(allocatable.items()) if is_gpu_resource(k)}


def node_labels(node: dict) -> dict[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def node_ready(node: dict) -> bool | None:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return {"True": True, "False": False}.get(condition.get("status"))
    return None


def pod_gpu_resources(pod: dict) -> dict[str, int]:
    """GPU resources a pod holds: per container, limits (requests must equal them for extended resources)."""
    held: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, value in wanted.items():
            if is_gpu_resource(name):
                held[name] = held.get(name, 0) + quantity(value)
    return {k: v for k, v in held.items() if v}


def is_operator_pod(pod: dict, operator_namespace: str) -> bool:
    """The GPU Operator's own DaemonSet pods: never user workload, never evicted by Tessera."""
    meta = pod.get("metadata") or {}
    if meta.get("namespace") != operator_namespace:
        return False
    return any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or [])


def holds_gpu(pod: dict, operator_namespace: str) -> bool:
    """A live pod (not Succeeded/Failed) with GPU resources, not one of the operator's DaemonSet pods."""
    if (pod.get("status") or {}).get("phase") in TERMINAL_POD_PHASES:
        return False
    return bool(pod_gpu_resources(pod)) and not is_operator_pod(pod, operator_namespace)
