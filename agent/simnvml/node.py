"""SimNvml: a simulated node's NVML, host and tools put together, with the controls tests and the demo drive."""

from __future__ import annotations

import math
import random
import time
import uuid as uuid_module
from collections.abc import Callable

import pynvml

from agent.simnvml.devices import SimGpu, SimMps, SimProcess
from agent.simnvml.events import SimEvents
from agent.simnvml.host import SimHost
from agent.simnvml.inventory import SimInventory
from agent.simnvml.metrics import SimMetrics
from agent.simnvml.mig import SimMig
from agent.simnvml.settings import SimGpuSettings
from agent.simnvml.tools import SimTools
from sharing.mig import get_product


class SimNvml(SimInventory, SimMetrics, SimGpuSettings, SimMig, SimEvents):
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
        self.reset_supported = reset_supported
        self.privileged = True
        self.numa_supported = numa_supported
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
        self.processes = []
        self.mps = SimMps()
        self.host = SimHost(self.gpus, f"sim-node-{seed}", numa_nodes)
        self.tools = SimTools(self)
        self._next_pid = 20000
        self._objects = {}
        self._event_sets = []
        self._initialized = 0
        for gpu in self.gpus:
            self._register(gpu.handle, gpu)

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
        if xid == 48:  # a double-bit ECC error is also counted
            self.add_ecc_errors(gpu_index, uncorrected=1)
        self._queue_xid(self.gpus[gpu_index], xid, gpu_instance_id, compute_instance_id)

    def add_ecc_errors(self, gpu_index: int, corrected: int = 0, uncorrected: int = 0) -> None:
        gpu = self.gpus[gpu_index]
        for counters in (gpu.ecc_volatile, gpu.ecc_aggregate):
            counters[0] += corrected
            counters[1] += uncorrected

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
