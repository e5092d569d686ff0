"""The agent driver: agents pull their desired config and report back, so applying is recording and reading is
the last report (Node fields written by the agent endpoints through agents/reports.py)."""

from collections.abc import Mapping, Sequence

from fleet.models import Gpu, Node
from worker.drivers.base import BusyPod, NodeState, NodeTarget


class AgentDriver:
    """Nothing to push: the active NodeChange is the agent's desired config (GET /api/v1/agent/desired/)."""

    def __init__(self, cluster):
        self.cluster = cluster

    def ensure_configs(self, *, mig_configs: Mapping[str, str], device_plugin_configs: Mapping[str, str]) -> None:
        return None  # served from NodeChange.to_config by /api/v1/agent/desired/

    def busy_pods(self, node_names: Sequence[str]) -> dict[str, list[BusyPod]]:
        """The compute processes each node's agent last reported, as host 'pods' (busy checks and messages)."""
        busy: dict[str, list[BusyPod]] = {}
        rows = (
            Gpu.objects.live()
            .filter(node__cluster=self.cluster, node__name__in=list(node_names))
            .order_by("node__name", "index")
            .values_list("node__name", "index", "processes")
        )
        for node_name, index, processes in rows:
            for process in processes or ():
                name = f"pid {process['pid']} on GPU {index}"
                busy.setdefault(node_name, []).append(BusyPod("host", name, {"nvidia.com/gpu": 1}))
        return busy

    def set_cordon(self, node_names: Sequence[str], cordoned: bool) -> dict[str, str]:
        return {}  # no scheduler to cordon against outside Kubernetes

    def evict(self, pods: Mapping[str, Sequence[BusyPod]]) -> dict[str, list[str]]:
        return {}  # host processes cannot be evicted: a drain simply waits until they end or the wait is over

    def apply(self, targets: Sequence[NodeTarget]) -> dict[str, str]:
        return {}  # the agent fetches the change on its next report

    def read(self, node_names: Sequence[str]) -> dict[str, NodeState]:
        nodes = Node.objects.filter(cluster=self.cluster, name__in=list(node_names))
        return {
            n.name: NodeState(
                node_name=n.name,
                mig_config=n.observed_mig_config,
                mig_state=n.config_state,
                device_plugin_config=n.observed_device_plugin_config,
                allocatable=n.allocatable,
                exists=n.gone_at is None,
                error=n.last_error,
                config_id=n.agent_config_id,
            )
            for n in nodes
        }

    def restart_config_manager(self, node_name: str) -> None:
        return None

    def restart_dra_plugin(self, node_name: str) -> None:
        return None  # agents drive NVML themselves: no DRA plugin
