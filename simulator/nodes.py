"""Node objects as a kubelet and the node lifecycle controller would publish them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from simulator.fleet import SimNode, instance_type

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_UNREACHABLE_TAINTS = [
    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
]
KUBELET_VERSION = "v1.32.4"
_OPERATOR_COMPONENTS = ("driver", "container-toolkit", "operator-validator", "device-plugin")
_OPERATOR_COMPONENTS += ("gpu-feature-discovery", "dcgm-exporter", "dcgm", "node-status-exporter")
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."


def _timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def base_labels(node: SimNode) -> dict[str, str]:
    """Kubernetes, NFD and operator labels; GFD's own come from simulator.labels."""
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": instance_type(node),
        "topology.kubernetes.io/zone": node.zone,
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/gpu.present": "true",
    }
    for component in _OPERATOR_COMPONENTS:
        labels[DEPLOY_PREFIX + component] = "true"
    if node.product.mig_capable:
        labels[DEPLOY_PREFIX + "mig-manager"] = "true"
    return labels


def conditions(ready: bool, since: str) -> list[dict]:
    def condition(kind: str, status: str, reason: str, message: str) -> dict:
        return {
            "type": kind,
            "status": status,
            "lastHeartbeatTime": since,
            "lastTransitionTime": since,
            "reason": reason,
            "message": message,
        }

    if not ready:
        stopped = "Kubelet stopped posting node status."
        return [
            condition(kind, "Unknown", "NodeStatusUnknown", stopped)
            for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
        ]
    return [
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]


def node_object(node: SimNode, now: datetime) -> dict:
    """The Node as registered; GPU labels and resources are added by the simulated operator afterwards."""
    created = _timestamp(now - timedelta(days=30 + node.index % 200, minutes=node.index % 1440))
    base = {
        "cpu": str(node.cpu),
        "memory": f"{node.memory_gib * 1024 * 1024}Ki",
        "ephemeral-storage": "3748905296Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "pods": "110",
    }
    allocatable = dict(base, cpu=f"{node.cpu * 1000 - 500}m", memory=f"{(node.memory_gib - 8) * 1024 * 1024}Ki")
    return {
        "metadata": {
            "name": node.name,
            "creationTimestamp": created,
            "labels": base_labels(node),
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "nfd.node.kubernetes.io/feature-labels": "pci-10de.present",
            },
        },
        "spec": {"podCIDR": f"10.244.{node.index % 256}.0/24", "providerID": f"sim://{node.zone}/{node.name}"},
        "status": {
            "capacity": base,
            "allocatable": allocatable,
            "conditions": conditions(node.ready, created),
            "addresses": [
                {"type": "InternalIP", "address": node.internal_ip},
                {"type": "Hostname", "address": node.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": node.gpus[0].uuid[4:].replace("-", ""),
                "systemUUID": node.gpus[-1].uuid[4:].upper(),
                "bootID": node.gpus[0].uuid[4:],
                "kernelVersion": "5.15.0-131-generic",
                "osImage": "Ubuntu 22.04.5 LTS",
                "containerRuntimeVersion": "containerd://1.7.27",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def set_ready(obj: dict, ready: bool) -> None:
    """Flip the Ready condition and the unreachable taints the node lifecycle controller manages."""
    obj["status"]["conditions"] = conditions(ready, _timestamp(datetime.now(UTC)))
    taints = [t for t in obj["spec"].get("taints", []) if t["key"] != "node.kubernetes.io/unreachable"]
    if not ready:
        taints += [dict(t, timeAdded=_timestamp(datetime.now(UTC))) for t in _UNREACHABLE_TAINTS]
    if taints:
        obj["spec"]["taints"] = taints
    else:
        obj["spec"].pop("taints", None)


def normalize(old: dict | None, new: dict) -> None:
    """Keep the unschedulable taint in step with spec.unschedulable, as the node lifecycle controller does."""
    spec = new.setdefault("spec", {})
    taints = [t for t in spec.get("taints", []) if t.get("key") != UNSCHEDULABLE_TAINT["key"]]
    if spec.get("unschedulable"):
        previous = next(
            (t for t in (old or {}).get("spec", {}).get("taints", []) if t.get("key") == UNSCHEDULABLE_TAINT["key"]),
            None,
        )
        taints.append(previous or dict(UNSCHEDULABLE_TAINT, timeAdded=_timestamp(datetime.now(UTC))))
    if taints:
        spec["taints"] = taints
    else:
        spec.pop("taints", None)
