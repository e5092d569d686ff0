"""What the agent needs from a node, whatever drives it: real NVML and NVIDIA's tools, or the simulated layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from agent.protocol import (
    GpuReport,
    HostSettings,
    MigSettings,
    MpsSettings,
    NodeSettings,
    TimeSliceInterval,
    XidEvent,
)
from sharing.mig import Placement


@dataclass(frozen=True)
class NodeSnapshot:
    """Inventory and metrics at one moment; `boot_id` tells whether the node rebooted since the last apply."""

    hostname: str
    boot_id: str
    driver_version: str
    cuda_version: str
    numa_nodes: int | None
    gpus: tuple[GpuReport, ...]
    host: HostSettings


@dataclass(frozen=True)
class MigTarget:
    """One GPU a mig-parted config selects: the MIG mode and, when enabled, the placements it should end with."""

    index: int
    uuid: str
    pci_bus_id: str
    enabled: bool
    devices: dict[str, int]
    placements: tuple[Placement, ...]
    mode_change: bool
    layout_change: bool

    @property
    def changed(self) -> bool:
        return self.mode_change or self.layout_change


@dataclass(frozen=True)
class MigPlan:
    """A validated MIG change: nothing is touched until it is applied, and it says which GPUs it will disturb."""

    selected: str
    config_text: str
    targets: tuple[MigTarget, ...]

    @property
    def changed(self) -> tuple[MigTarget, ...]:
        return tuple(target for target in self.targets if target.changed)


class Backend(ABC):
    """A node's GPUs: read them, and change how they are shared."""

    @abstractmethod
    def snapshot(self) -> NodeSnapshot:
        """Inventory and metrics of every GPU and the host settings, now."""

    @abstractmethod
    def drain_xid_events(self) -> list[XidEvent]:
        """XID events that arrived since the previous call; each is returned once."""

    @abstractmethod
    def plan_mig(self, mig: MigSettings) -> MigPlan:
        """Validate a mig-parted config against this node's GPUs; raises ApplyError before anything is touched."""

    @abstractmethod
    def apply_mig(self, plan: MigPlan) -> None:
        """Bring the GPUs to the plan's MIG modes and layouts."""

    @abstractmethod
    def apply_mps(self, mps: MpsSettings | None) -> None:
        """Run the MPS control daemon with these defaults, or stop it (None)."""

    @abstractmethod
    def mps_running(self) -> bool:
        """Whether an MPS control daemon answers: it dies with the agent's container, unlike GPU settings."""

    @abstractmethod
    def set_time_slice(self, interval: TimeSliceInterval) -> None:
        """Set the time-slice length of every GPU that is not in MIG mode."""

    @abstractmethod
    def set_persistence_mode(self, enabled: bool) -> None:
        """Turn persistence mode on or off on every GPU."""

    @abstractmethod
    def check_node_settings(self, settings: NodeSettings) -> None:
        """Refuse a QoS policy's settings this node cannot take (ApplyError), before anything is touched."""

    @abstractmethod
    def apply_node_settings(self, settings: NodeSettings, previous: NodeSettings | None = None) -> list[str]:
        """Apply a QoS policy's GPU settings and host tuning, verify them by reading back, and say what changed.

        `previous` is what the agent applied before (since boot): a setting the agent set and the new policy drops is
        undone (locked clocks reset, power limit, time slice and compute mode back to default); host tuning it drops
        stays as it is. The MPS limits are not applied here: they travel with the MPS settings (`apply_mps`).
        """

    @abstractmethod
    def busy_processes(self, gpu_uuids: Iterable[str]) -> list[tuple[str, int]]:
        """(GPU UUID, PID) of every compute process on these GPUs."""

    @abstractmethod
    def close(self) -> None:
        """Release the driver library."""
