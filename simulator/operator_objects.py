"""What the GPU Operator installs and writes: the ClusterPolicy, the mig-parted and device-plugin ConfigMaps, and the
status and Events of a device plugin whose config-manager crashes."""

from __future__ import annotations

from simulator.workload import DAEMONSET_BY_APP, OPERATOR_NAMESPACE

CLUSTER_POLICY = "cluster-policy"
DEFAULT_MIG_CONFIGMAP = "default-mig-parted-config"
DEVICE_PLUGIN_CONFIGMAP = "device-plugin-config"

# The plugin image the ClusterPolicy names, as the Helm chart writes it (repository, image, version).
_PLUGIN_REFERENCE, _, _PLUGIN_VERSION = DAEMONSET_BY_APP["nvidia-device-plugin-daemonset"].image.rpartition(":")
_PLUGIN_REPOSITORY, _, _PLUGIN_IMAGE = _PLUGIN_REFERENCE.rpartition("/")


def cluster_policy(mig_config_name: str, mig_strategy: str) -> dict:
    return {
        "metadata": {"name": CLUSTER_POLICY},
        "spec": {
            "operator": {"defaultRuntime": "containerd"},
            "driver": {"enabled": False},
            "migManager": {
                "enabled": True,
                "config": {"name": mig_config_name, "default": "all-disabled"},
                "env": [{"name": "WITH_REBOOT", "value": "false"}],
            },
            "devicePlugin": {
                "enabled": True,
                "repository": _PLUGIN_REPOSITORY,
                "image": _PLUGIN_IMAGE,
                "version": _PLUGIN_VERSION,
                "config": {"name": DEVICE_PLUGIN_CONFIGMAP, "default": ""},
            },
            "mig": {"strategy": mig_strategy},
            "gfd": {"enabled": True},
            "dcgmExporter": {"enabled": True},
        },
        "status": {"state": "ready", "namespace": OPERATOR_NAMESPACE},
    }


DEVICE_PLUGIN_CONFIGS = {
    "default": "version: v1\nflags:\n  migStrategy: none\n",
    "time-sliced-4": (
        "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 4\n"
    ),
    "mps-4": (
        "version: v1\nflags:\n  migStrategy: none\nsharing:\n  mps:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 4\n"
    ),
}


def configmap(name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict:
    meta: dict = {"name": name, "namespace": OPERATOR_NAMESPACE}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "data": data}


def generated_configmap_name(node: str) -> str:
    return f"{node}-mig-config"


def crash_container(pod: dict, *, container: str, restarts: int, error: str) -> None:
    """The device plugin pod with one container (config-manager, or the plugin itself) in CrashLoopBackOff (on a
    clone of the pod)."""
    pod["status"]["phase"] = "Running"
    for status in pod["status"]["containerStatuses"]:
        if status["name"] == container:
            status.update(ready=False, restartCount=restarts, started=False)
            status["state"] = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container {container}: {error}",
                }
            }
    for condition in pod["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = "False"


def config_manager_running(pod: dict, *, started: str) -> None:
    for status in pod["status"]["containerStatuses"]:
        status.update(ready=True, started=True, state={"running": {"startedAt": started}})
    for condition in pod["status"]["conditions"]:
        condition["status"] = "True"


def backoff_event(pod: dict, node: str, error: str, serial: int, now: str, container: str = "config-manager") -> dict:
    """The kubelet's Warning Event for a crashing container; `serial` keeps names unique across restarts."""
    pod_name = pod["metadata"]["name"]
    return {
        "metadata": {"name": f"{pod_name}.{serial:016x}", "namespace": OPERATOR_NAMESPACE},
        "involvedObject": {
            "kind": "Pod",
            "namespace": OPERATOR_NAMESPACE,
            "name": pod_name,
            "uid": pod["metadata"]["uid"],
            "apiVersion": "v1",
            "fieldPath": f"spec.containers{{{container}}}",
        },
        "reason": "BackOff",
        "message": f"Back-off restarting failed container {container} in pod {pod_name}: {error}",
        "source": {"component": "kubelet", "host": node},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "type": "Warning",
        "reportingComponent": "kubelet",
        "reportingInstance": node,
    }
