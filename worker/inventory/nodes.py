"""Nodes from the Kubernetes API: Node objects and GPU Feature Discovery labels as the fleet's observations."""

import logging

from kubernetes import client

from fleet.observations import NodeObservation
from worker.drivers.kubernetes import api as k8s
from worker.drivers.kubernetes.labels import (
    GPU_NODE_SELECTOR,
    MIG_CONFIG,
    MIG_STATE,
    MIG_STATES,
    PLUGIN_CONFIG,
    gpu_allocatable,
    node_labels,
    node_ready,
)

log = logging.getLogger(__name__)

# Labels that change on every GFD pass without meaning anything: storing them would rewrite every node each time.
VOLATILE_LABELS = ("nvidia.com/gfd.timestamp",)


def _count(value) -> int:
    """A count label's value; anything unreadable counts as none."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def observed_mode(labels: dict, allocatable: dict) -> str:
    """MIG when the node shows MIG devices (mixed: mig-* labels/resources; single: -MIG- product), else the
    device plugin's sharing strategy (contracts §3.6)."""
    mig = "-MIG-" in labels.get("nvidia.com/gpu.product", "") or any(
        key.startswith("nvidia.com/mig-") and key.endswith(".count") and _count(value) > 0
        for key, value in labels.items()
    )
    if mig or any(key.startswith("nvidia.com/mig-") and count for key, count in allocatable.items()):
        return "mig"
    strategy = labels.get("nvidia.com/gpu.sharing-strategy", "none")
    return {"mps": "mps", "time-slicing": "time_slicing"}.get(strategy, "passthrough")


def config_state(labels: dict, allocatable: dict, ready: bool | None) -> str:
    """`nvidia.com/mig.config.state` where MIG Manager runs. Nodes without it (no MIG-capable GPU) have only the
    device plugin to judge by: success while it advertises GPUs, failed when a selected config left it advertising
    none (§3.4 crash), unknown otherwise. Without this the loop would see such nodes as never in sync."""
    state = labels.get(MIG_STATE)
    if state in MIG_STATES:
        return state
    if labels.get("nvidia.com/mig.capable") == "true" or ready is False:
        return "unknown"
    if any(allocatable.values()):
        return "success"
    return "failed" if labels.get(PLUGIN_CONFIG) else "unknown"


def node_error(labels: dict, allocatable: dict, ready: bool | None, warning: str) -> str:
    """What is wrong with the node's sharing config, if anything (the latest Warning event explains it)."""
    if labels.get(MIG_STATE) == "failed":
        text = f"MIG Manager failed to apply {labels.get(MIG_CONFIG, '')!r}"
        return text + (f": {warning}" if warning else "")
    plugin_up = labels.get("nvidia.com/gpu.deploy.device-plugin", "true") == "true"
    if ready and plugin_up and not any(allocatable.values()) and warning:
        return warning
    return ""


def node_observation(node: dict, *, gpus=None, warning: str = "", stack=None) -> NodeObservation:
    """A Node object (raw JSON) as the fleet's observation; `gpus` None leaves the node's GPUs as they are, `stack`
    (a gpustack.DraView) None its GPU stack."""
    labels = {k: v for k, v in node_labels(node).items() if k not in VOLATILE_LABELS}
    allocatable = gpu_allocatable(node)
    ready = node_ready(node)
    info = (node.get("status") or {}).get("nodeInfo") or {}
    driver = labels.get("nvidia.com/cuda.driver-version.full") or ".".join(
        labels[k]
        for k in ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
                  "nvidia.com/cuda.driver-version.revision")
        if k in labels
    )  # fmt: skip
    cuda = labels.get("nvidia.com/cuda.runtime-version.full") or ".".join(
        labels[k] for k in ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor")
        if k in labels
    )  # fmt: skip
    gpu_stack, dynamic_mig = stack.stack(node["metadata"]["name"], labels, allocatable) if stack else (None, None)
    return NodeObservation(
        name=node["metadata"]["name"],
        labels=labels,
        ready=ready,
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        allocatable=allocatable,
        kubelet_version=info.get("kubeletVersion", ""),
        driver_version=driver,
        cuda_version=cuda,
        observed_mode=observed_mode(labels, allocatable),
        observed_mig_config=labels.get(MIG_CONFIG, ""),
        observed_device_plugin_config=labels.get(PLUGIN_CONFIG, ""),
        config_state=config_state(labels, allocatable, ready),
        last_error=node_error(labels, allocatable, ready, warning)[:2000],
        gpus=gpus,
        gpu_stack=gpu_stack,
        dynamic_mig=dynamic_mig,
    )


def list_gpu_nodes(core: client.CoreV1Api) -> tuple[list[dict], str]:
    """Every GPU node (label nvidia.com/gpu.present=true), paginated; and the resourceVersion to watch from."""
    return k8s.list_all(core.list_node, label_selector=GPU_NODE_SELECTOR, limit=500)


def warnings_by_node(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    """The latest Warning event per node in the operator's namespace (e.g. the config-manager's crash, §3.4)."""
    try:
        events, _ = k8s.list_all(core.list_namespaced_event, namespace, field_selector="type=Warning", limit=1000)
    except Exception as exc:  # a nicety: the inventory is right without it
        log.info("warning events unavailable: %s", k8s.error_text(exc))
        return {}
    latest: dict[str, tuple[str, str]] = {}
    for event in events:
        host = (event.get("source") or {}).get("host") or event.get("reportingInstance") or ""
        at = event.get("lastTimestamp") or event.get("eventTime") or ""
        if host and at >= latest.get(host, ("", ""))[0]:
            latest[host] = (at, str(event.get("message", "")))
    return {host: message for host, (_, message) in latest.items()}
