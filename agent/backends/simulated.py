"""The NVML backend over simulated GPUs: the same mapping and apply code, no driver needed (`--simulate`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from agent.backends.nvml import NvmlBackend
from agent.simnvml import SimNvml

DEFAULT_PRODUCT = "NVIDIA-H100-80GB-HBM3"


class SimulatedBackend(NvmlBackend):
    """NvmlBackend wired to a SimNvml, its stand-in tools and host; `sim` is there to inject events and load."""

    def __init__(
        self,
        *,
        seed: int = 0,
        product: str = DEFAULT_PRODUCT,
        gpus: int = 8,
        clock: Callable[[], float] = time.monotonic,
        workload: bool = True,
        reset_supported: bool = True,
        numa_supported: bool = True,
    ):
        self.sim = SimNvml(
            seed=seed,
            product=product,
            gpus=gpus,
            clock=clock,
            workload=workload,
            reset_supported=reset_supported,
            numa_supported=numa_supported,
        )
        super().__init__(self.sim, run=self.sim.tools.run, which=self.sim.tools.which, host=self.sim.host)
