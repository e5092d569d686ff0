"""Node objects as a kubelet and the node lifecycle controller would publish them."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta

from simulator.errors import ApiError
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


_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUALIFIED_NAME_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _check_taints(name: str, taints: object) -> None:
    """The API server's validation of spec.taints: a 422 Invalid naming the field, as for `kubectl taint` typos."""
    if not isinstance(taints, list):
        raise ApiError.invalid("nodes", name, f"spec.taints: Invalid value: {taints!r}: must be a list")
    seen = set()
    for i, taint in enumerate(taints):
        where = f"spec.taints[{i}]"
        if not isinstance(taint, dict):
            raise ApiError.invalid("nodes", name, f"{where}: Invalid value: {taint!r}: must be an object")
        key, value, effect = taint.get("key", ""), taint.get("value", ""), taint.get("effect", "")
        if not isinstance(key, str) or not _QUALIFIED_NAME_RE.match(key):
            raise ApiError.invalid("nodes", name, f"{where}.key: Invalid value: {key!r}: must be a qualified name")
        if not isinstance(value, str) or not _LABEL_VALUE_RE.match(value):
            raise ApiError.invalid("nodes", name, f"{where}.value: Invalid value: {value!r}: must be a label value")
        if effect not in _TAINT_EFFECTS:
            supported = ", ".join(f'"{e}"' for e in _TAINT_EFFECTS)
            detail = "Required value" if not effect else f'Unsupported value: "{effect}": supported values: {supported}'
            raise ApiError.invalid("nodes", name, f"{where}.effect: {detail}")
        if (key, effect) in seen:
            raise ApiError.invalid(
                "nodes", name, f'{where}: Duplicate value: "{key}:{effect}": taints must be unique by key and effect'
            )
        seen.add((key, effect))


def normalize(old: dict | None, new: dict) -> None:
    """Validate spec.taints as the API server does, and keep the unschedulable taint in step with
    spec.unschedulable, as the node lifecycle controller does."""
    spec = new.setdefault("spec", {})
    if "taints" in spec:
        _check_taints(new.get("metadata", {}).get("name", ""), spec["taints"])
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


# What a kubelet accepts for the settings the control endpoint may change (contracts §7.2).
KUBELET_CHOICES = {
    "topologyManagerPolicy": ("none", "best-effort", "restricted", "single-numa-node"),
    "topologyManagerScope": ("container", "pod"),
    "cpuManagerPolicy": ("none", "static"),
    "memoryManagerPolicy": ("None", "Static"),
}


def check_kubelet_settings(changes: object) -> dict[str, str]:
    """A valid subset of KUBELET_CHOICES, or a 400 naming what is wrong."""
    if not isinstance(changes, dict) or not changes:
        raise ApiError.bad_request(f"the body must set some of: {', '.join(KUBELET_CHOICES)}")
    for key, value in changes.items():
        if key not in KUBELET_CHOICES:
            raise ApiError.bad_request(
                f"{key} is not a kubelet setting the simulator varies; known: {', '.join(KUBELET_CHOICES)}"
            )
        if value not in KUBELET_CHOICES[key]:
            raise ApiError.bad_request(f"{key} must be one of {', '.join(KUBELET_CHOICES[key])}, not {value!r}")
    return dict(changes)


# The running KubeletConfiguration of a kubeadm-made v1.32 kubelet; the settings in KUBELET_CHOICES are each node's
# own (placeholders here keep their place in the answer).
_KUBELET_CONFIG = {
    "enableServer": True,
    "staticPodPath": "/etc/kubernetes/manifests",
    "podLogsDir": "/var/log/pods",
    "syncFrequency": "1m0s",
    "fileCheckFrequency": "20s",
    "httpCheckFrequency": "20s",
    "address": "0.0.0.0",
    "port": 10250,
    "rotateCertificates": True,
    "serverTLSBootstrap": True,
    "authentication": {
        "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
        "webhook": {"enabled": True, "cacheTTL": "2m0s"},
        "anonymous": {"enabled": False},
    },
    "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"}},
    "registryPullQPS": 5,
    "registryBurst": 10,
    "eventRecordQPS": 50,
    "eventBurst": 100,
    "enableDebuggingHandlers": True,
    "healthzPort": 10248,
    "healthzBindAddress": "127.0.0.1",
    "oomScoreAdj": -999,
    "clusterDomain": "cluster.local",
    "clusterDNS": ["10.96.0.10"],
    "streamingConnectionIdleTimeout": "4h0m0s",
    "nodeStatusUpdateFrequency": "10s",
    "nodeStatusReportFrequency": "5m0s",
    "nodeLeaseDurationSeconds": 40,
    "imageMinimumGCAge": "2m0s",
    "imageMaximumGCAge": "0s",
    "imageGCHighThresholdPercent": 85,
    "imageGCLowThresholdPercent": 80,
    "volumeStatsAggPeriod": "1m0s",
    "cgroupsPerQOS": True,
    "cgroupDriver": "systemd",
    "cpuManagerPolicy": "none",
    "cpuManagerReconcilePeriod": "10s",
    "memoryManagerPolicy": "None",
    "topologyManagerPolicy": "none",
    "topologyManagerScope": "container",
    "runtimeRequestTimeout": "2m0s",
    "hairpinMode": "promiscuous-bridge",
    "maxPods": 110,
    "podPidsLimit": -1,
    "resolvConf": "/run/systemd/resolve/resolv.conf",
    "cpuCFSQuota": True,
    "cpuCFSQuotaPeriod": "100ms",
    "nodeStatusMaxImages": 50,
    "maxOpenFiles": 1000000,
    "contentType": "application/vnd.kubernetes.protobuf",
    "kubeAPIQPS": 50,
    "kubeAPIBurst": 100,
    "serializeImagePulls": True,
    "evictionHard": {
        "imagefs.available": "15%",
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
    },
    "evictionPressureTransitionPeriod": "5m0s",
    "enableControllerAttachDetach": True,
    "makeIPTablesUtilChains": True,
    "iptablesMasqueradeBit": 14,
    "iptablesDropBit": 15,
    "failSwapOn": True,
    "memorySwap": {},
    "containerLogMaxSize": "10Mi",
    "containerLogMaxFiles": 5,
    "configMapAndSecretChangeDetectionStrategy": "Watch",
    "enforceNodeAllocatable": ["pods"],
    "volumePluginDir": "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/",
    "logging": {
        "format": "text",
        "flushFrequency": "5s",
        "verbosity": 0,
        "options": {"json": {"infoBufferSize": "0"}},
    },
    "enableSystemLogHandler": True,
    "shutdownGracePeriod": "0s",
    "shutdownGracePeriodCriticalPods": "0s",
    "enableProfilingHandler": True,
    "enableDebugFlagsHandler": True,
    "seccompDefault": False,
    "memoryThrottlingFactor": 0.9,
    "registerNode": True,
    "localStorageCapacityIsolation": True,
    "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
}


def kubelet_configz(node: SimNode) -> dict:
    """`GET /api/v1/nodes/<name>/proxy/configz` as a v1.32 kubelet answers it: its running KubeletConfiguration."""
    settings = {"memoryManagerPolicy": "None", **node.kubelet}
    config = copy.deepcopy(_KUBELET_CONFIG)
    config.update({key: settings[key] for key in KUBELET_CHOICES})
    if settings["cpuManagerPolicy"] == "static":
        config["reservedSystemCPUs"] = "0-1"  # the static policy refuses to start without reserved CPUs
    if settings["memoryManagerPolicy"] == "Static":
        config["reservedMemory"] = [{"numaNode": 0, "limits": {"memory": "1124Mi"}}]
    return {"kubeletconfig": config}
