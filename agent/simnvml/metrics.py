"""Simulated NVML metrics: utilization, temperature, power, ECC counts and clocks, following the workload."""

from __future__ import annotations

import math
from typing import Any

import pynvml

from agent.simnvml.base import SimNvmlBase
from agent.simnvml.devices import TDP_W, SimGpu, nvml_error

IDLE_W = 60
IDLE_CLOCK_MHZ = 345


class SimMetrics(SimNvmlBase):
    """The nvmlDevice* reads of what a GPU does now; they rise and fall with the processes on it."""

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

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> pynvml.c_nvmlUtilization_t:
        gpu = self._gpu(handle)
        if gpu.mig_current:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # with MIG on there is no whole-GPU figure (§6)
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu = round(100 * self._activity(gpu))
        rates.memory = round(60 * self._activity(gpu))
        return rates

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return round(31 + 45 * self._activity(gpu) + 2 * math.sin(self.clock() / 90 + gpu.phase))

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        tdp = TDP_W.get(gpu.product.architecture, 300)
        drawn = round((IDLE_W + (tdp - IDLE_W) * self._activity(gpu)) * 1000)  # mW, as NVML reports it
        return min(drawn, gpu.enforced_power_limit_mw)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle)
        counters = gpu.ecc_volatile if counter_type == pynvml.NVML_VOLATILE_ECC else gpu.ecc_aggregate
        return counters[0 if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1]

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
