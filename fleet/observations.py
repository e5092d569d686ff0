"""What a node reported, as plain values: the one input shape for every source (Kubernetes sync, agent, seed)."""

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class MigDeviceObservation:
    profile: str
    start: int
    size: int
    uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_mib: int = 0
    in_use_by: str = ""
    dra_device: str = ""  # driver/pool/device on a DRA node (sharing.dra.device_key)


@dataclass(frozen=True)
class GpuObservation:
    index: int
    uuid: str
    product: str
    memory_mib: int = 0
    pci_bus_id: str = ""
    pci_device_id: str = ""
    numa_node: int | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_pending: bool | None = None
    health: str = "unknown"
    # None: this report says nothing about MIG devices (leave them); a tuple: exactly these exist.
    mig_devices: tuple[MigDeviceObservation, ...] | None = None
    # None: this source does not read GPU settings (leave them); a dict: {compute_mode, persistence_mode, ...}.
    settings: dict | None = None
    # None: this source does not read DRA devices (leave it); else driver/pool/device, "" when not published whole.
    dra_device: str | None = None


@dataclass(frozen=True)
class NodeObservation:
    name: str
    labels: dict = field(default_factory=dict)
    ready: bool | None = None
    unschedulable: bool = False
    allocatable: dict = field(default_factory=dict)
    kubelet_version: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    numa_nodes: int | None = None
    observed_mode: str = ""
    observed_mig_config: str = ""
    observed_device_plugin_config: str = ""
    config_state: str = "unknown"
    last_error: str = ""
    # None: this report says nothing about GPUs (leave them); a tuple: exactly these GPUs are present.
    gpus: tuple[GpuObservation, ...] | None = None
    # None: this source does not read host tuning (leave it); a dict: {thp, swappiness, cpu_governor, ...}.
    host_settings: dict | None = None
    # None: this source does not read the GPU stack (leave it and dynamic_mig); else a fleet.choices.GpuStack value.
    gpu_stack: str | None = None
    dynamic_mig: bool | None = None


@dataclass(frozen=True)
class MigDeviceMetrics:
    """One MIG device's utilisation and memory in use, joined by its GPU instance id within its GPU."""

    gpu_instance_id: int
    utilization_pct: float | None = None
    memory_used_mib: int | None = None


@dataclass(frozen=True)
class GpuMetrics:
    """One utilisation/health sample of a GPU, joined by UUID (dcgm-exporter or the agent). None: not in this
    sample (the stored value stays)."""

    uuid: str
    utilization_pct: float | None = None
    memory_used_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    last_xid: int | None = None
    ecc_dbe_total: int | None = None
    ecc_sbe_total: int | None = None
    row_remap_failure: bool | None = None
    row_remap_pending: bool | None = None
    uncorrectable_remapped_rows: int | None = None
    correctable_remapped_rows: int | None = None
    # The dcgm-exporter health counters this sample carried (fleet.health.HEALTH_SIGNALS); None: not said.
    health_signals: tuple[str, ...] | None = None
    mig_devices: tuple[MigDeviceMetrics, ...] = ()


@dataclass(frozen=True)
class PodObservation:
    """A pod on a node that holds GPU resources (the only pods Tessera tracks); its labels and times feed the
    demand and GPU-hours records (capacity/)."""

    namespace: str
    name: str
    uid: str
    phase: str = ""
    qos_class: str = ""
    priority_class: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    gpu_resources: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    created_at: datetime | None = None  # metadata.creationTimestamp
    scheduled_at: datetime | None = None  # the PodScheduled condition's lastTransitionTime


@dataclass(frozen=True)
class PendingPodObservation:
    """A pod that asks for GPU resources and no node took yet: demand waiting (capacity/ records it per pool)."""

    namespace: str
    name: str
    uid: str
    gpu_resources: dict
    created_at: datetime
    labels: dict = field(default_factory=dict)
    node_selector: dict = field(default_factory=dict)
