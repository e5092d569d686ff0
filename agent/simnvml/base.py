"""What every part of the simulated NVML shares: the handle registry, the processes on each GPU, and GPU reset."""

from __future__ import annotations

import ctypes
import random
from collections.abc import Callable
from typing import Any

import pynvml

from agent.simnvml.devices import EventSet, SimGpu, SimMps, SimProcess, nvml_error
from sharing.mig import GpuProduct

WORKLOAD_WINDOW_S = 300
WORKLOAD_BUSY_CHANCE = 0.1  # per GPU and window: most changes find their GPUs idle, some wait


class SimNvmlBase:
    """The state `SimNvml.__init__` sets up, and the lookups the NVML functions of each area use."""

    seed: int
    product: GpuProduct
    clock: Callable[[], float]
    workload: bool
    reset_supported: bool  # False: a pass-through VM, where only a reboot applies MIG mode
    privileged: bool  # False: NVML setters answer NVML_ERROR_NO_PERMISSION, as for a non-root agent
    numa_supported: bool  # False: an older driver without nvmlDeviceGetNumaNodeId
    gpus: list[SimGpu]
    processes: list[SimProcess]
    mps: SimMps
    _next_pid: int
    _objects: dict[int, Any]
    _event_sets: list[EventSet]
    _initialized: int

    # -- handles -----------------------------------------------------------------------------------------------------

    def _register(self, struct: ctypes.Structure, obj: Any) -> None:
        self._objects[ctypes.addressof(struct)] = obj

    def _forget(self, struct: ctypes.Structure) -> None:
        self._objects.pop(ctypes.addressof(struct), None)

    def _check_initialized(self) -> None:
        if not self._initialized:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _resolve(self, handle: Any, kind: type | tuple[type, ...]) -> Any:
        self._check_initialized()
        obj = self._objects.get(ctypes.cast(handle, ctypes.c_void_p).value) if handle else None
        if not isinstance(obj, kind):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _gpu(self, handle: Any) -> SimGpu:
        return self._resolve(handle, SimGpu)

    # -- the simulated workload ------------------------------------------------------------------------------------

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

    # -- reset -------------------------------------------------------------------------------------------------------

    def reset(self, gpu: SimGpu) -> str:
        """A GPU reset: the pending MIG mode takes effect and volatile ECC counts clear. '' or why it failed."""
        if not self.reset_supported:
            return f"GPU {gpu.pci_bus_id}: resetting the GPU is not supported on this system; reboot the node"
        if self._processes(gpu):
            return f"GPU {gpu.pci_bus_id}: in use by another client; stop all processes using it first"
        self._power_cycle(gpu)
        return ""

    def _power_cycle(self, gpu: SimGpu) -> None:
        gpu.mig_current = gpu.mig_pending
        for gi in gpu.gpu_instances:
            for ci in gi.compute_instances:
                self._forget(ci.handle)
                self._forget(ci.device)
            self._forget(gi.handle)
        gpu.gpu_instances = []
        gpu.ecc_volatile = [0, 0]
