"""A simulated NVML: the pynvml functions the NVML backend calls, over GPUs built from the MIG catalog.

Handles are real ctypes pointers and results are pynvml's own structures, so `agent/backends/nvml.py` runs unchanged
over it. Errors are the NVMLError a GPU would raise: a GPU instance at a placement the catalog forbids
(NVML_ERROR_INVALID_ARGUMENT), one that overlaps or exceeds a profile's count (INSUFFICIENT_RESOURCES), destroying
what a process uses (IN_USE). A MIG mode change stays pending until the GPU is reset or the node reboots (§1.3).

Everything is deterministic from the seed and the clock: UUIDs, PCI ids, NUMA nodes, the background workload
(processes come and go in 5-minute windows) and the metrics that follow it. Tests and the demo drive it with
`start_process`, `stop_process`, `inject_xid`, `add_ecc_errors`, `reboot`, and the host's `set`. `SimTools` stands
in for nvidia-smi and nvidia-cuda-mps-control; there is no nvidia-mig-parted, so MIG goes through NVML.
"""

from __future__ import annotations

import collections
import ctypes
import math
import random
import re
import subprocess
import time
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from agent.backends.base import ApplyError
from agent.host import SYSCTL_FILES, THP_FILE, tuning_changes, tuning_problems
from agent.protocol import HostSettings, HostTuning
from sharing.mig import GpuProduct, MigProfile, get_product

MIB = 1024 * 1024
DRIVER_VERSION = "570.133.20"
CUDA_DRIVER_VERSION = 12080
NOT_AVAILABLE = 0xFFFFFFFF
WORKLOAD_WINDOW_S = 300
WORKLOAD_BUSY_CHANCE = 0.1  # per GPU and window: most changes find their GPUs idle, some wait
TDP_W = {"ampere": 400, "hopper": 700, "blackwell": 1000, "ada-lovelace": 350, "turing": 70}
IDLE_W = 60
# (max graphics clock, memory clock) in MHz by architecture; graphics clocks step by 15 MHz from 210 (as NVML lists).
CLOCKS_MHZ = {
    "ampere": (1410, 1593),
    "hopper": (1980, 2619),
    "blackwell": (1965, 3996),
    "ada-lovelace": (2520, 9001),
    "turing": (1590, 5001),
}
LOWEST_CLOCK_MHZ = 210
IDLE_CLOCK_MHZ = 345
CPU_GOVERNORS = ("conservative", "ondemand", "performance", "powersave", "schedutil", "userspace")  # acpi-cpufreq
# Compute-instance profile index -> compute slices it spans.
CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml maps the code to its subclass, e.g. NVMLError_InUse


def _deref(reference: Any) -> Any:
    """The object behind ctypes.byref(x), as the C side would write through the pointer."""
    return getattr(reference, "_obj", reference)


def gi_profile_index(profile: MigProfile) -> int:
    """The NVML profile index (NVML_GPU_INSTANCE_PROFILE_*) a catalog profile is listed under."""
    if profile.compute_slices == 1:
        if profile.media_extensions:
            return pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
        if profile.memory_slices == 2:
            return pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
        return pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    if profile.compute_slices == 2:
        if profile.media_extensions:
            return pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
        return pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
    return {
        3: pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        4: pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        7: pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    }[profile.compute_slices]


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
        return TDP_W.get(self.product.architecture, 300) * 1000

    @property
    def power_range_mw(self) -> tuple[int, int]:
        return self.tdp_mw * 3 // 10, self.tdp_mw

    @property
    def clocks_mhz(self) -> tuple[int, int]:
        """(max graphics clock, memory clock)."""
        return CLOCKS_MHZ.get(self.product.architecture, (1800, 1500))


@dataclass
class SimMps:
    """The simulated MPS control daemon's state, as nvidia-cuda-mps-control set it."""

    running: bool = False
    active_thread_percentage: int = 100
    pinned_mem_limits: dict[int, str] = field(default_factory=dict)


class _EventSet:
    def __init__(self) -> None:
        self.handle = pynvml.struct_c_nvmlEventSet_t()
        self.registered: dict[int, int] = {}  # GPU index -> event type mask
        self.queue: collections.deque = collections.deque()


class SimHost:
    """Host identity and tuning of a simulated node; `set` changes a setting as sysctl or sysfs would."""

    def __init__(self, sim: SimNvml, hostname: str, numa_nodes: int):
        self._sim = sim
        self._hostname = hostname
        self._numa_nodes = numa_nodes
        self._boot_id = str(uuid_module.uuid4())  # simulated GPUs start fresh in every process: a new boot
        self._settings: dict[str, Any] = {
            "thp": "madvise",
            "swappiness": 60,
            "cpu_governor": "performance",
            "dirty_ratio": 20,
            "dirty_background_ratio": 10,
        }
        self.available_governors = set(CPU_GOVERNORS)
        self.writable = True  # False: an agent that is not root, or an unprivileged container

    def hostname(self) -> str:
        return self._hostname

    def boot_id(self) -> str:
        return self._boot_id

    def reboot(self) -> None:
        self._boot_id = str(uuid_module.uuid4())

    def numa_nodes(self) -> int:
        return self._numa_nodes

    def pci_numa_node(self, pci_bus_id: str) -> int | None:
        return next((gpu.numa_node for gpu in self._sim.gpus if gpu.pci_bus_id == pci_bus_id), None)

    def settings(self) -> HostSettings:
        return HostSettings(**self._settings)

    def set(self, name: str, value: Any) -> None:
        if name not in self._settings:
            raise KeyError(f"{name} is not a host setting; known: {', '.join(self._settings)}")
        self._settings[name] = value

    def check_tuning(self, tuning: HostTuning) -> None:
        problems = tuning_problems(tuning, self.settings(), self.available_governors)
        if problems:
            raise ApplyError("host tuning: " + "; ".join(problems))

    def apply(self, tuning: HostTuning) -> list[str]:
        """As LinuxHost.apply, in memory: the same checks, messages and refusals (not root: permission denied)."""
        self.check_tuning(tuning)
        wanted = tuning.to_dict()  # only the settings the tuning has
        if wanted and not self.writable:
            first = next(iter(wanted))
            path = THP_FILE if first == "transparent_hugepages" else SYSCTL_FILES.get(first, "sys/devices/system/cpu")
            raise ApplyError(
                f"host tuning: cannot write /{path}: permission denied (the agent must run as root, privileged in a "
                "container); nothing was changed"
            )
        before = self.settings()
        for name, value in wanted.items():
            self._settings["thp" if name == "transparent_hugepages" else name] = value
        return tuning_changes(before, self.settings())


class SimNvml:
    """pynvml-compatible functions over simulated GPUs of one catalog product."""

    def __init__(
        self,
        *,
        seed: int = 0,
        product: str = "NVIDIA-H100-80GB-HBM3",
        gpus: int = 8,
        clock: Callable[[], float] = time.monotonic,
        workload: bool = True,
        reset_supported: bool = True,
        numa_supported: bool = True,
        numa_nodes: int = 2,
    ):
        if not 1 <= gpus <= 16:
            raise ValueError(f"a simulated node has 1 to 16 GPUs, not {gpus}")
        self.seed = seed
        self.product = get_product(product)
        self.clock = clock
        self.workload = workload
        self.reset_supported = reset_supported  # False: a pass-through VM, where only a reboot applies MIG mode
        self.privileged = True  # False: NVML setters answer NVML_ERROR_NO_PERMISSION, as for a non-root agent
        self.numa_supported = numa_supported  # False: an older driver without nvmlDeviceGetNumaNodeId
        rng = random.Random(seed)
        self.gpus = [
            SimGpu(
                index=index,
                product=self.product,
                uuid=f"GPU-{uuid_module.UUID(int=rng.getrandbits(128), version=4)}",
                pci_bus_id=f"00000000:{(index + 1) * 0x0F:02X}:00.0",
                numa_node=index * numa_nodes // gpus,
                phase=rng.uniform(0, 2 * math.pi),
            )
            for index in range(gpus)
        ]
        self.processes: list[SimProcess] = []
        self.mps = SimMps()
        self.host = SimHost(self, f"sim-node-{seed}", numa_nodes)
        self.tools = SimTools(self)
        self._next_pid = 20000
        self._objects: dict[int, Any] = {}
        self._event_sets: list[_EventSet] = []
        self._initialized = 0
        for gpu in self.gpus:
            self._register(gpu.handle, gpu)

    # -- handles -----------------------------------------------------------------------------------------------------

    def _register(self, struct: ctypes.Structure, obj: Any) -> None:
        self._objects[ctypes.addressof(struct)] = obj

    def _forget(self, struct: ctypes.Structure) -> None:
        self._objects.pop(ctypes.addressof(struct), None)

    def _resolve(self, handle: Any, kind: type | tuple[type, ...]) -> Any:
        if not self._initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        obj = self._objects.get(ctypes.cast(handle, ctypes.c_void_p).value) if handle else None
        if not isinstance(obj, kind):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _gpu(self, handle: Any) -> SimGpu:
        return self._resolve(handle, SimGpu)

    def _settable_gpu(self, handle: Any) -> SimGpu:
        """A GPU to change: setters need root (NVML_ERROR_NO_PERMISSION otherwise)."""
        gpu = self._gpu(handle)
        if not self.privileged:
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        return gpu

    def _mig_capable_gpu(self, handle: Any) -> SimGpu:
        gpu = self._gpu(handle)
        if not gpu.product.mig_capable:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _profile(self, gpu: SimGpu, profile_id: int) -> MigProfile:
        profile = next((p for p in gpu.product.profiles if p.profile_id == profile_id), None)
        if profile is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    # -- controls for tests and the demo -----------------------------------------------------------------------------

    def start_process(
        self,
        gpu_index: int,
        used_mib: int = 1024,
        gpu_instance_id: int | None = None,
        compute_instance_id: int | None = None,
    ) -> int:
        """Start a compute process; on a MIG GPU it runs in the given instance (default: the first MIG device)."""
        gpu = self.gpus[gpu_index]
        if gpu.mig_current:
            cis = [
                ci
                for ci in gpu.compute_instances
                if gpu_instance_id in (None, ci.gpu_instance.id) and compute_instance_id in (None, ci.id)
            ]
            if not cis:
                raise ValueError(f"GPU {gpu_index} has no MIG device {gpu_instance_id}/{compute_instance_id}")
            gpu_instance_id, compute_instance_id = cis[0].gpu_instance.id, cis[0].id
        self._next_pid += 1
        self.processes.append(SimProcess(self._next_pid, gpu_index, used_mib, gpu_instance_id, compute_instance_id))
        return self._next_pid

    def stop_process(self, pid: int) -> None:
        self.processes = [process for process in self.processes if process.pid != pid]

    def inject_xid(
        self, gpu_index: int, xid: int, gpu_instance_id: int | None = None, compute_instance_id: int | None = None
    ) -> None:
        """Raise an XID critical error on a GPU, as the driver would (§10)."""
        gpu = self.gpus[gpu_index]
        if xid == 48:  # a double-bit ECC error is also counted
            self.add_ecc_errors(gpu_index, uncorrected=1)
        for event_set in self._event_sets:
            if event_set.registered.get(gpu_index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                data = pynvml.c_nvmlEventData_t()
                data.device = ctypes.pointer(gpu.handle)
                data.eventType = pynvml.nvmlEventTypeXidCriticalError
                data.eventData = xid
                data.gpuInstanceId = NOT_AVAILABLE if gpu_instance_id is None else gpu_instance_id
                data.computeInstanceId = NOT_AVAILABLE if compute_instance_id is None else compute_instance_id
                event_set.queue.append(data)

    def add_ecc_errors(self, gpu_index: int, corrected: int = 0, uncorrected: int = 0) -> None:
        gpu = self.gpus[gpu_index]
        for counters in (gpu.ecc_volatile, gpu.ecc_aggregate):
            counters[0] += corrected
            counters[1] += uncorrected

    def reset(self, gpu: SimGpu) -> str:
        """A GPU reset: the pending MIG mode takes effect and volatile ECC counts clear. '' or why it failed."""
        if not self.reset_supported:
            return f"GPU {gpu.pci_bus_id}: resetting the GPU is not supported on this system; reboot the node"
        if self._processes(gpu):
            return f"GPU {gpu.pci_bus_id}: in use by another client; stop all processes using it first"
        self._power_cycle(gpu)
        return ""

    def reboot(self) -> None:
        """A node reboot: pending MIG modes apply, processes, MIG devices, MPS and GPU settings are gone."""
        self.processes = []
        self.mps = SimMps()
        for gpu in self.gpus:
            self._power_cycle(gpu)
            gpu.compute_mode = pynvml.NVML_COMPUTEMODE_DEFAULT
            gpu.persistence = pynvml.NVML_FEATURE_DISABLED
            gpu.time_slice = 0
            gpu.locked_clocks = gpu.power_limit_mw = None
        self.host.reboot()

    def _power_cycle(self, gpu: SimGpu) -> None:
        gpu.mig_current = gpu.mig_pending
        for gi in gpu.gpu_instances:
            for ci in gi.compute_instances:
                self._forget(ci.handle)
                self._forget(ci.device)
            self._forget(gi.handle)
        gpu.gpu_instances = []
        gpu.ecc_volatile = [0, 0]

    # -- the simulated workload and the metrics that follow it -------------------------------------------------------

    def _workload(self, gpu: SimGpu) -> list[SimProcess]:
        """Background jobs: in each 5-minute window a GPU runs one job (on one of its MIG devices) or none."""
        if not self.workload:
            return []
        rng = random.Random(f"{self.seed}/{gpu.index}/{int(self.clock() // WORKLOAD_WINDOW_S)}")
        if rng.random() >= WORKLOAD_BUSY_CHANCE:
            return []
        gi_id = ci_id = None
        memory_mib = gpu.product.memory_mib
        if gpu.mig_current:
            if not gpu.compute_instances:
                return []
            ci = rng.choice(gpu.compute_instances)
            gi_id, ci_id, memory_mib = ci.gpu_instance.id, ci.id, ci.gpu_instance.profile.memory_mib
        pid = rng.randrange(100000, 4000000)
        return [SimProcess(pid, gpu.index, int(memory_mib * rng.uniform(0.2, 0.9)), gi_id, ci_id)]

    def _processes(self, gpu: SimGpu) -> list[SimProcess]:
        return [process for process in self.processes if process.gpu_index == gpu.index] + self._workload(gpu)

    def _activity(self, gpu: SimGpu) -> float:
        """0..1: how hard the GPU works now, a slow wave while jobs run."""
        processes = self._processes(gpu)
        if not processes:
            return 0.0
        share = 1.0
        if gpu.mig_current and gpu.compute_instances:
            busy = {(p.gpu_instance_id, p.compute_instance_id) for p in processes}
            share = len(busy) / len(gpu.compute_instances)
        return share * (0.7 + 0.25 * math.sin(2 * math.pi * self.clock() / 600 + gpu.phase))

    # -- init, system ------------------------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        if not self._initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return DRIVER_VERSION

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return CUDA_DRIVER_VERSION

    # -- devices -----------------------------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        if not self._initialized:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ctypes.pointer(self.gpus[index].handle)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self.nvmlDeviceGetCount()
        gpu = next((gpu for gpu in self.gpus if gpu.uuid == uuid), None)
        if gpu is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return ctypes.pointer(gpu.handle)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).product.display_name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        device = self._resolve(handle, (SimGpu, SimComputeInstance))
        return device.uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> pynvml.nvmlPciInfo_t:
        gpu = self._gpu(handle)
        info = pynvml.nvmlPciInfo_t()
        domain, bus, device_function = gpu.pci_bus_id.split(":")
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{device_function}".encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device_function.split(".")[0], 16)
        info.pciDeviceId = int(gpu.product.pci_device_id, 16)
        info.pciSubSystemId = 0x16C110DE
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> pynvml.c_nvmlMemory_t:
        device = self._resolve(handle, (SimGpu, SimComputeInstance))
        if isinstance(device, SimGpu):
            total_mib, used_mib = device.product.memory_mib, sum(p.used_mib for p in self._processes(device))
        else:
            gi = device.gpu_instance
            total_mib = gi.profile.memory_mib
            used_mib = sum(
                p.used_mib
                for p in self._processes(gi.gpu)
                if (p.gpu_instance_id, p.compute_instance_id) == (gi.id, device.id)
            )
        memory = pynvml.c_nvmlMemory_t()
        memory.total, memory.used = total_mib * MIB, min(used_mib, total_mib) * MIB
        memory.free = memory.total - memory.used
        return memory

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        if not self.numa_supported:
            raise _error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return gpu.numa_node

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        device = self._resolve(handle, (SimGpu, SimComputeInstance))
        gpu = device if isinstance(device, SimGpu) else device.gpu_instance.gpu
        processes = self._processes(gpu)
        if isinstance(device, SimComputeInstance):
            where = (device.gpu_instance.id, device.id)
            processes = [p for p in processes if (p.gpu_instance_id, p.compute_instance_id) == where]
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": process.pid,
                    "usedGpuMemory": process.used_mib * MIB,
                    "gpuInstanceId": NOT_AVAILABLE if process.gpu_instance_id is None else process.gpu_instance_id,
                    "computeInstanceId": (
                        NOT_AVAILABLE if process.compute_instance_id is None else process.compute_instance_id
                    ),
                }
            )
            for process in processes
        ]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu(handle)
        if gpu.mig_current:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # with MIG on there is no whole-GPU figure (§6)
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu = round(100 * self._activity(gpu))
        rates.memory = round(60 * self._activity(gpu))
        return rates

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(31 + 45 * self._activity(gpu) + 2 * math.sin(self.clock() / 90 + gpu.phase))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        tdp = TDP_W.get(gpu.product.architecture, 300)
        drawn = round((IDLE_W + (tdp - IDLE_W) * self._activity(gpu)) * 1000)  # mW, as NVML reports it
        return min(drawn, self.nvmlDeviceGetPowerManagementLimit(handle))

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle)
        counters = gpu.ecc_volatile if counter_type == pynvml.NVML_VOLATILE_ECC else gpu.ecc_aggregate
        return counters[0 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1]

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        return self._gpu(handle).compute_mode

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        gpu = self._settable_gpu(handle)
        if mode not in (
            pynvml.NVML_COMPUTEMODE_DEFAULT,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD,
            pynvml.NVML_COMPUTEMODE_PROHIBITED,
            pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
        ):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.compute_mode = mode

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return self._gpu(handle).persistence

    def nvmlDeviceSetPersistenceMode(self, handle: Any, mode: int) -> None:
        self._settable_gpu(handle).persistence = mode

    # -- clocks and power (§6) ---------------------------------------------------------------------------------------

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self.nvmlDeviceGetPowerManagementLimit(handle)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return gpu.power_limit_mw if gpu.power_limit_mw is not None else gpu.tdp_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._gpu(handle).tdp_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        return list(self._gpu(handle).power_range_mw)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit_mw: int) -> None:
        gpu = self._settable_gpu(handle)
        low, high = gpu.power_range_mw
        if not low <= limit_mw <= high:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = None if limit_mw == gpu.tdp_mw else limit_mw

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        return gpu.clocks_mhz[1] if clock_type == pynvml.NVML_CLOCK_MEM else gpu.clocks_mhz[0]

    def nvmlDeviceGetApplicationsClock(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return gpu.clocks_mhz[1]
        return gpu.clocks_mhz[0] * 9 // 10 // 15 * 15

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        """The clock now: idle low, busy high, and inside the locked range when one is set."""
        gpu = self._gpu(handle)
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return gpu.clocks_mhz[1]
        top = gpu.clocks_mhz[0]
        activity = self._activity(gpu)
        clock = (
            IDLE_CLOCK_MHZ + round((top - IDLE_CLOCK_MHZ) * min(1.0, activity / 0.7)) if activity else IDLE_CLOCK_MHZ
        )
        if gpu.locked_clocks:
            low, high = gpu.locked_clocks
            clock = min(max(clock, low), high)
        return clock

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        memory = self._gpu(handle).clocks_mhz[1]
        return [memory, memory // 2, 405]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memory_clock_mhz: int) -> list[int]:
        gpu = self._gpu(handle)
        if memory_clock_mhz not in self.nvmlDeviceGetSupportedMemoryClocks(handle):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return list(range(gpu.clocks_mhz[0], LOWEST_CLOCK_MHZ - 1, -15))

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, min_mhz: int, max_mhz: int) -> None:
        gpu = self._settable_gpu(handle)
        if not LOWEST_CLOCK_MHZ <= min_mhz <= max_mhz <= gpu.clocks_mhz[0]:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.locked_clocks = (min_mhz, max_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._settable_gpu(handle).locked_clocks = None

    # -- MIG mode and GPU instances (§1.3, §4.1, §6) -----------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._mig_capable_gpu(handle)
        return [int(gpu.mig_current), int(gpu.mig_pending)]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        gpu = self._mig_capable_gpu(handle)
        if self._processes(gpu) or gpu.gpu_instances:
            raise _error(pynvml.NVML_ERROR_IN_USE)
        gpu.mig_pending = bool(mode)
        if gpu.mig_pending == gpu.mig_current or self.reset_supported:
            return pynvml.NVML_SUCCESS
        return pynvml.NVML_ERROR_RESET_REQUIRED  # a pass-through VM: only a reboot activates it (§1.3)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        gpu = self._mig_capable_gpu(handle)
        found = next((p for p in gpu.product.profiles if gi_profile_index(p) == profile), None)
        if found is None:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = found.profile_id
        info.sliceCount = found.compute_slices
        info.instanceCount = found.max_count
        info.multiprocessorCount = found.multiprocessors
        info.copyEngineCount = found.compute_slices
        info.decoderCount = info.jpegCount = info.ofaCount = int(found.media_extensions or found.compute_slices >= 7)
        info.memorySizeMB = found.memory_mib
        info.name = f"MIG {found.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        gpu = self._mig_capable_gpu(handle)
        profile = self._profile(gpu, profile_id)
        count = _deref(count_ref)
        if placements is None:
            count.value = len(profile.starts)
            return pynvml.NVML_SUCCESS
        if len(placements) < len(profile.starts):
            count.value = len(profile.starts)
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, start in enumerate(profile.starts):
            placements[slot].start, placements[slot].size = start, profile.memory_slices
        count.value = len(profile.starts)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, instances: Any, count_ref: Any) -> int:
        gpu = self._mig_capable_gpu(handle)
        if not gpu.mig_current:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile(gpu, profile_id)
        found = [gi for gi in gpu.gpu_instances if gi.profile == profile]
        count = _deref(count_ref)
        if len(found) > len(instances):
            count.value = len(found)
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, gi in enumerate(found):
            instances[slot] = ctypes.pointer(gi.handle)
        count.value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> pynvml.c_nvmlGpuInstanceInfo_t:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = ctypes.pointer(gi.gpu.handle)
        info.id, info.profileId = gi.id, gi.profile.profile_id
        info.placement = pynvml.c_nvmlGpuInstancePlacement_t(gi.start, gi.profile.memory_slices)
        return info

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement_ref: Any) -> Any:
        gpu = self._mig_capable_gpu(handle)
        if not gpu.mig_current:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile(gpu, profile_id)
        placement = _deref(placement_ref)
        if placement.start not in profile.starts or placement.size != profile.memory_slices:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a placement this profile has (§4.1)
        new = SimGpuInstance(gpu, 0, profile, placement.start)
        existing = gpu.gpu_instances
        compute = sum(gi.profile.compute_slices for gi in existing) + profile.compute_slices
        if (
            sum(gi.profile == profile for gi in existing) >= profile.max_count
            or (profile.media_extensions and any(gi.profile.media_extensions for gi in existing))
            or compute > gpu.product.compute_slices
            or any(gi.mask & new.mask for gi in existing)
        ):
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        used = {gi.id for gi in existing}
        new.id = 0 if profile.compute_slices == gpu.product.compute_slices else min(set(range(1, 64)) - used)
        existing.append(new)
        self._register(new.handle, new)
        return ctypes.pointer(new.handle)

    def nvmlGpuInstanceDestroy(self, gpu_instance: Any) -> int:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        if gi.compute_instances or any(p.gpu_instance_id == gi.id for p in self._processes(gi.gpu)):
            raise _error(pynvml.NVML_ERROR_IN_USE)
        gi.gpu.gpu_instances.remove(gi)
        self._forget(gi.handle)
        return pynvml.NVML_SUCCESS

    # -- compute instances and MIG devices ---------------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: Any, profile: int, engine_profile: int, version: int = 2
    ) -> Any:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        slices = CI_SLICES.get(profile)
        if (
            engine_profile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            or slices is None
            or slices > gi.profile.compute_slices
        ):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = profile, slices
        info.instanceCount = gi.profile.compute_slices // slices
        info.multiprocessorCount = gi.profile.multiprocessors * slices // gi.profile.compute_slices
        info.name = f"MIG {slices}c.{gi.profile.name}".encode()
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: Any, profile_id: int) -> Any:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        slices = CI_SLICES.get(profile_id)
        if slices is None or slices > gi.profile.compute_slices:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if sum(ci.slices for ci in gi.compute_instances) + slices > gi.profile.compute_slices:
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gpu = gi.gpu
        gpu.mig_generation += 1  # a recreated MIG device gets a new UUID, as on hardware
        ci_id = min(set(range(8)) - {ci.id for ci in gi.compute_instances})
        mig_uuid = f"MIG-{uuid_module.uuid5(uuid_module.NAMESPACE_OID, f'{gpu.uuid}/{gpu.mig_generation}')}"
        ci = SimComputeInstance(gi, ci_id, profile_id, slices, mig_uuid)
        gi.compute_instances.append(ci)
        self._register(ci.handle, ci)
        self._register(ci.device, ci)
        return ctypes.pointer(ci.handle)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: Any, profile_id: int, instances: Any, count_ref: Any
    ) -> int:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        found = [ci for ci in gi.compute_instances if ci.profile_index == profile_id]
        count = _deref(count_ref)
        if len(found) > len(instances):
            count.value = len(found)
            raise _error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, ci in enumerate(found):
            instances[slot] = ctypes.pointer(ci.handle)
        count.value = len(found)
        return pynvml.NVML_SUCCESS

    def nvmlComputeInstanceDestroy(self, compute_instance: Any) -> int:
        ci = self._resolve(compute_instance, SimComputeInstance)
        gi = ci.gpu_instance
        if any((p.gpu_instance_id, p.compute_instance_id) == (gi.id, ci.id) for p in self._processes(gi.gpu)):
            raise _error(pynvml.NVML_ERROR_IN_USE)
        gi.compute_instances.remove(ci)
        self._forget(ci.handle)
        self._forget(ci.device)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return self._mig_capable_gpu(handle).product.compute_slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._mig_capable_gpu(handle)
        devices = gpu.compute_instances
        if not 0 <= index < len(devices):
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return ctypes.pointer(devices[index].device)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._resolve(handle, SimComputeInstance).gpu_instance.id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._resolve(handle, SimComputeInstance).id

    def nvmlDeviceGetAttributes(self, handle: Any) -> pynvml.c_nvmlDeviceAttributes:
        ci = self._resolve(handle, SimComputeInstance)
        profile = ci.gpu_instance.profile
        attributes = pynvml.c_nvmlDeviceAttributes()
        attributes.multiprocessorCount = profile.multiprocessors * ci.slices // profile.compute_slices
        attributes.sharedCopyEngineCount = profile.compute_slices
        attributes.gpuInstanceSliceCount = profile.compute_slices
        attributes.computeInstanceSliceCount = ci.slices
        attributes.memorySizeMB = profile.memory_mib
        return attributes

    # -- events ------------------------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self.nvmlDeviceGetCount()
        event_set = _EventSet()
        self._event_sets.append(event_set)
        self._register(event_set.handle, event_set)
        return ctypes.pointer(event_set.handle)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._gpu(handle)
        target = self._resolve(event_set, _EventSet)
        target.registered[gpu.index] = target.registered.get(gpu.index, 0) | event_types

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> pynvml.c_nvmlEventData_t:
        """The next queued event; a simulated wait never blocks, it times out at once when nothing is queued."""
        target = self._resolve(event_set, _EventSet)
        if not target.queue:
            raise _error(pynvml.NVML_ERROR_TIMEOUT)
        return target.queue.popleft()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        target = self._resolve(event_set, _EventSet)
        self._event_sets.remove(target)
        self._forget(target.handle)


class SimTools:
    """nvidia-smi and nvidia-cuda-mps-control as far as the agent uses them (§1.3, §5), acting on the simulation."""

    TOOLS = ("nvidia-smi", "nvidia-cuda-mps-control")

    def __init__(self, sim: SimNvml):
        self.sim = sim
        self.calls: list[list[str]] = []

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.TOOLS else None

    def run(self, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
        self.calls.append(list(argv))
        tool, args = argv[0].rsplit("/", 1)[-1], list(argv[1:])
        if tool == "nvidia-smi" and args[:1] == ["-r"]:
            return self._reset(argv, args)
        if tool == "nvidia-smi" and args[:1] == ["compute-policy"]:
            return self._compute_policy(argv, args)
        if tool == "nvidia-cuda-mps-control":
            return self._mps(argv, args, input or "")
        return subprocess.CompletedProcess(argv, 127, "", f"{tool}: command not found")

    def _find(self, identifier: str) -> SimGpu | None:
        return next((g for g in self.sim.gpus if identifier in (g.uuid, g.pci_bus_id, str(g.index))), None)

    def _reset(self, argv: list[str], args: list[str]) -> subprocess.CompletedProcess:
        if len(args) != 3 or args[1] != "-i":
            return subprocess.CompletedProcess(argv, 2, "", "usage: nvidia-smi -r -i <ids>")
        gpus = [self._find(identifier) for identifier in args[2].split(",")]
        if None in gpus:
            return subprocess.CompletedProcess(argv, 2, "", f"No devices were found matching {args[2]}")
        for gpu in gpus:
            problem = self.sim.reset(gpu)
            if problem:
                code = 3 if not self.sim.reset_supported else 255
                return subprocess.CompletedProcess(argv, code, "", problem)
        return subprocess.CompletedProcess(argv, 0, "All done.\n", "")

    def _compute_policy(self, argv: list[str], args: list[str]) -> subprocess.CompletedProcess:
        if len(args) != 5 or args[1] != "-i" or args[3] != "--set-timeslice":
            usage = "usage: nvidia-smi compute-policy -i <id> --set-timeslice N"
            return subprocess.CompletedProcess(argv, 2, "", usage)
        gpu = self._find(args[2])
        if gpu is None or args[4] not in ("0", "1", "2", "3"):
            return subprocess.CompletedProcess(argv, 2, "", f"Invalid device or timeslice: {args[2]} {args[4]}")
        gpu.time_slice = int(args[4])
        return subprocess.CompletedProcess(argv, 0, f"Set timeslice to {args[4]} for GPU {gpu.pci_bus_id}\n", "")

    def _mps(self, argv: list[str], args: list[str], commands: str) -> subprocess.CompletedProcess:
        mps = self.sim.mps
        if args == ["-d"]:
            if mps.running:
                return subprocess.CompletedProcess(argv, 1, "", "An instance of this daemon is already running")
            self.sim.mps = SimMps(running=True)
            return subprocess.CompletedProcess(argv, 0, "", "")
        if args or not mps.running:
            return subprocess.CompletedProcess(argv, 1, "", "Cannot find MPS control daemon process")
        for line in commands.splitlines():
            words = line.split()
            if words == ["quit"]:
                mps.running = False
            elif words == ["get_server_list"]:
                continue  # no MPS server runs until a client connects
            elif len(words) == 2 and words[0] == "set_default_active_thread_percentage" and words[1].isdigit():
                if not 1 <= int(words[1]) <= 100:
                    return subprocess.CompletedProcess(argv, 1, "", f"Invalid percentage {words[1]}")
                mps.active_thread_percentage = int(words[1])
            elif (
                len(words) == 3
                and words[0] == "set_default_device_pinned_mem_limit"
                and self._find(words[1]) is not None
                and re.fullmatch(r"\d+[MG]", words[2])
            ):
                mps.pinned_mem_limits[int(words[1])] = words[2]
            elif words:
                return subprocess.CompletedProcess(argv, 1, "", f"Unrecognized command: {line}")
        return subprocess.CompletedProcess(argv, 0, "", "")
