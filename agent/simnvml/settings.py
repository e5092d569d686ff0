"""Simulated NVML GPU settings: compute mode, persistence, power limit and locked clocks (§6)."""

from __future__ import annotations

from typing import Any

import pynvml

from agent.simnvml.base import SimNvmlBase
from agent.simnvml.devices import SimGpu, nvml_error

LOWEST_CLOCK_MHZ = 210


class SimGpuSettings(SimNvmlBase):
    """The settings a QoS policy changes, with the ranges and refusals of a real GPU."""

    def _settable_gpu(self, handle: Any) -> SimGpu:
        """A GPU to change: setters need root (NVML_ERROR_NO_PERMISSION otherwise)."""
        gpu = self._gpu(handle)
        if not self.privileged:
            raise nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        return gpu

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
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.compute_mode = mode

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return self._gpu(handle).persistence

    def nvmlDeviceSetPersistenceMode(self, handle: Any, mode: int) -> None:
        self._settable_gpu(handle).persistence = mode

    # -- power limit -------------------------------------------------------------------------------------------------

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._gpu(handle).enforced_power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._gpu(handle).enforced_power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._gpu(handle).tdp_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        return list(self._gpu(handle).power_range_mw)

    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit_mw: int) -> None:
        gpu = self._settable_gpu(handle)
        low, high = gpu.power_range_mw
        if not low <= limit_mw <= high:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = None if limit_mw == gpu.tdp_mw else limit_mw

    # -- locked clocks -----------------------------------------------------------------------------------------------

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        memory = self._gpu(handle).clocks_mhz[1]
        return [memory, memory // 2, 405]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memory_clock_mhz: int) -> list[int]:
        gpu = self._gpu(handle)
        if memory_clock_mhz not in self.nvmlDeviceGetSupportedMemoryClocks(handle):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return list(range(gpu.clocks_mhz[0], LOWEST_CLOCK_MHZ - 1, -15))

    def nvmlDeviceSetGpuLockedClocks(self, handle: Any, min_mhz: int, max_mhz: int) -> None:
        gpu = self._settable_gpu(handle)
        if not LOWEST_CLOCK_MHZ <= min_mhz <= max_mhz <= gpu.clocks_mhz[0]:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.locked_clocks = (min_mhz, max_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        self._settable_gpu(handle).locked_clocks = None
