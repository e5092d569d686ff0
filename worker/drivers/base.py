"""The contract every driver keeps; the rollout engine speaks only this, in batches (drivers parallelise I/O)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


class DriverError(Exception):
    """A driver could not do what was asked; `transient` errors are retried with backoff, others fail the step."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class NodeTarget:
    """The configs a node should select: a mig-parted config name (None: leave MIG alone) and a plugin key
    ("": remove the selection, so the device plugin uses its default)."""

    node_name: str
    mig_config: str | None
    device_plugin_config: str


@dataclass(frozen=True)
class NodeState:
    """What the node shows now (labels/allocatable for Kubernetes, the last report for agents)."""

    node_name: str
    mig_config: str = ""
    mig_state: str = "unknown"  # pending | rebooting | success | failed | unknown
    device_plugin_config: str = ""
    allocatable: Mapping[str, int] = field(default_factory=dict)
    unschedulable: bool = False
    exists: bool = True
    error: str = ""
    # The desired config id the node says it applied: agents report it; Kubernetes has none (None), so its
    # changes are judged from labels and allocatable alone.
    config_id: str | None = None
    # When the node's DRA kubelet plugin (gpu.nvidia.com) last started; None: not a DRA node. On a DRA node
    # `allocatable` is its pool's devices under the device plugin's names (sharing.dra.pool_resources).
    dra_plugin_started_at: datetime | None = None
    # What GPU Feature Discovery's labels say the hardware has, under the same names (a DRA node under a
    # ClusterPolicy): the plugin must publish it once MIG Manager is done.
    dra_hardware: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class BusyPod:
    """A pod holding GPU resources on a node (what blocks a MIG change)."""

    namespace: str
    name: str
    gpu_resources: Mapping[str, int] = field(default_factory=dict)


class Driver(Protocol):
    """Batch operations keyed by node name; each returns per-node results or raises DriverError for the batch."""

    def ensure_configs(self, *, mig_configs: Mapping[str, str], device_plugin_configs: Mapping[str, str]) -> None:
        """Make sure these content-addressed configs exist where the node software reads them, before any label."""

    def busy_pods(self, node_names: Sequence[str]) -> dict[str, list[BusyPod]]:
        """GPU-holding pods per node."""

    def set_cordon(self, node_names: Sequence[str], cordoned: bool) -> dict[str, str]:
        """Cordon or uncordon; returns node -> error text for the nodes that failed."""

    def evict(self, pods: Mapping[str, Sequence[BusyPod]]) -> dict[str, list[str]]:
        """Evict pods; returns node -> messages for pods that could not be evicted now (e.g. 429 from a PDB)."""

    def apply(self, targets: Sequence[NodeTarget]) -> dict[str, str]:
        """Point each node at its target configs; returns node -> error text for nodes that failed."""

    def read(self, node_names: Sequence[str]) -> dict[str, NodeState]:
        """Current state of each node."""

    def restart_config_manager(self, node_name: str) -> None:
        """Kick a node's MIG manager so it re-reads its label (the known wedged-`pending` bug, contracts §1.2)."""

    def restart_dra_plugin(self, node_name: str) -> None:
        """Restart a DRA node's gpu.nvidia.com kubelet plugin: it discovers MIG devices only at start (§13.1)."""
