"""What the GPU Operator installs: the ClusterPolicy, the mig-parted and device-plugin ConfigMaps, and their names."""

from __future__ import annotations

from simulator.workload import OPERATOR_NAMESPACE

CLUSTER_POLICY = "cluster-policy"
DEFAULT_MIG_CONFIGMAP = "default-mig-parted-config"
DEVICE_PLUGIN_CONFIGMAP = "device-plugin-config"


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
            "devicePlugin": {"enabled": True, "config": {"name": DEVICE_PLUGIN_CONFIGMAP, "default": ""}},
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
