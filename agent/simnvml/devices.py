"""The simulated hardware's state: GPUs, their GPU and compute instances, processes, the MPS daemon, event sets."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import pynvml

from sharing.mig import GpuProduct, MigProfile

MIB = 1024 * 1024
NOT_AVAILABLE = 0xFFFFFFFF
TDP_W = {"ampere": 400, "hopper": 700, "blackwell": 1000, "ada-lovelace": 350, "turing": 70}
# (max graphics clock, memory clock) in MHz by architecture; graphics clocks step by 15 MHz from 210 (as NVML lists).
CLOCKS_MHZ = {
    "ampere": (1410, 1593),
    "hopper": (1980, 2619),
    "blackwell": (1965, 3996),
    "ada-lovelace": (2520, 9001),
    "turing": (1590, 5001),
}


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml maps the code to its subclass, e.g. NVMLError_InUse


def deref(reference: Any) -> Any:
    """The object behind ctypes.byref(x), as the C side would write through the pointer."""
    return getattr(reference, "_obj", reference)


@dataclass(eq=False)
class SimComputeInstance:
    gpu_instance: SimGpuInstance
    id: int
    profile_index: int
    slices: int
    uuid: str
    handle: pynvml.struct_c_nvmlComputeInstance_t = field(default_factory=pynvml.struct_c_nvmlComputeInstance_t)
    device: pynvml.struct_c_nvmlDevice_t = field(default_factory=pynvml.struct_c_nvmlDevice_t)  # the MIG device


@dataclass(eq=False)
class SimGpuInstance:
    gpu: SimGpu
    id: int
    profile: MigProfile
    start: int
    compute_instances: list[SimComputeInstance] = field(default_factory=list)
    handle: pynvml.struct_c_nvmlGpuInstance_t = field(default_factory=pynvml.struct_c_nvmlGpuInstance_t)

    @property
    def mask(self) -> int:
        return ((1 << self.profile.memory_slices) - 1) << self.start


@dataclass(eq=False)
class SimProcess:
    pid: int
    gpu_index: int
    used_mib: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(eq=False)
class SimGpu:
    index: int
    product: GpuProduct
    uuid: str
    pci_bus_id: str
    numa_node: int
    phase: float
    mig_current: bool = False
    mig_pending: bool = False
    gpu_instances: list[SimGpuInstance] = field(default_factory=list)
    compute_mode: int = pynvml.NVML_COMPUTEMODE_DEFAULT
    persistence: int = pynvml.NVML_FEATURE_DISABLED
    time_slice: int = 0
    ecc_volatile: list[int] = field(default_factory=lambda: [0, 0])  # corrected, uncorrected
    ecc_aggregate: list[int] = field(default_factory=lambda: [0, 0])
    mig_generation: int = 0
    locked_clocks: tuple[int, int] | None = None  # nvmlDeviceSetGpuLockedClocks; gone on reset or reboot
    power_limit_mw: int | None = None  # None: the default limit
    handle: pynvml.struct_c_nvmlDevice_t = field(default_factory=pynvml.struct_c_nvmlDevice_t)

    @property
    def compute_instances(self) -> list[SimComputeInstance]:
        return [ci for gi in sorted(self.gpu_instances, key=lambda gi: gi.start) for ci in gi.compute_instances]

    @property
    def tdp_mw(self) -> int:
        """The default power limit: the board's maximum from the MIG catalog (§4.3), as on NVIDIA's boards."""
        if self.product.power_limit_w:
            return self.product.power_limit_w[1] * 1000
        return TDP_W.get(self.product.architecture, 300) * 1000

    @property
    def power_range_mw(self) -> tuple[int, int]:
        """What nvmlDeviceGetPowerManagementLimitConstraints answers: the catalog's range, so the server's check of
        a QoS power limit and this GPU's refusal agree."""
        if self.product.power_limit_w:
            low, high = self.product.power_limit_w
            return low * 1000, high * 1000
        return self.tdp_mw * 3 // 10, self.tdp_mw

    @property
    def enforced_power_limit_mw(self) -> int:
        """The power limit in force: the one set, or the default (the TDP)."""
        return self.power_limit_mw if self.power_limit_mw is not None else self.tdp_mw

    @property
    def clocks_mhz(self) -> tuple[int, int]:
        """(max graphics clock, memory clock); the graphics clock is the catalog's (§4.3) where it has one."""
        graphics, memory = CLOCKS_MHZ.get(self.product.architecture, (1800, 1500))
        return (self.product.graphics_clock_mhz[1] if self.product.graphics_clock_mhz else graphics), memory


@dataclass
class SimMps:
    """The simulated MPS control daemon's state, as nvidia-cuda-mps-control set it."""

    running: bool = False
    active_thread_percentage: int = 100
    pinned_mem_limits: dict[int, str] = field(default_factory=dict)


class EventSet:
    """An NVML event set: the GPUs and event types registered on it, and the events waiting to be read."""

    def __init__(self) -> None:
        self.handle = pynvml.struct_c_nvmlEventSet_t()
        self.registered: dict[int, int] = {}  # GPU index -> event type mask
        self.queue: collections.deque = collections.deque()
