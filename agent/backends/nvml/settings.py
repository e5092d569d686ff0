"""NVML backend QoS node settings: persistence, compute mode, time slice, locked clocks, power limit, host tuning."""

from __future__ import annotations

from typing import Any

import pynvml

from agent.backends.nvml.calls import COMPUTE_MODES, call_nvml, nvml_error_name, on_gpus
from agent.backends.nvml.mps import NvmlMps
from agent.errors import ApplyError
from agent.protocol import GpuSettings, NodeSettings

COMPUTE_MODE_VALUES = {name: value for value, name in COMPUTE_MODES.items()}


class NvmlNodeSettings(NvmlMps):
    """A QoS policy's settings: checked on every GPU first, applied step by step, read back where NVML can."""

    def _clock_range(self, handle: Any) -> tuple[int, int]:
        """Lowest and highest graphics clock the GPU supports at its top memory clock (MHz)."""
        nv = self.nvml
        memory = max(nv.nvmlDeviceGetSupportedMemoryClocks(handle))
        clocks = nv.nvmlDeviceGetSupportedGraphicsClocks(handle, memory)
        return min(clocks), max(clocks)

    def _locked_range(self, handle: Any, gpu: GpuSettings) -> tuple[int, int]:
        """The range to lock: a bound the policy leaves open is the GPU's own (NVML takes no mixed symbolic values)."""
        low, high = self._clock_range(handle)
        return gpu.gpu_clock_min_mhz or low, gpu.gpu_clock_max_mhz or high

    def _gpu_setting_problems(self, handle: Any, gpu: GpuSettings) -> list[str]:
        nv, problems = self.nvml, []
        if gpu.gpu_clock_min_mhz or gpu.gpu_clock_max_mhz:
            try:
                low, high = self._clock_range(handle)
            except pynvml.NVMLError as error:
                problems.append(f"its supported clocks cannot be read ({nvml_error_name(error)})")
            else:
                lo, hi = gpu.gpu_clock_min_mhz or low, gpu.gpu_clock_max_mhz or high
                if lo > hi:
                    problems.append(f"locked clocks {lo}-{hi} MHz: the minimum is above the maximum")
                elif lo < low or hi > high:
                    problems.append(f"locked clocks {lo}-{hi} MHz are outside this GPU's {low}-{high} MHz")
        if gpu.power_limit_w is not None:
            try:
                low_mw, high_mw = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            except pynvml.NVMLError as error:
                problems.append(f"its power limit range cannot be read ({nvml_error_name(error)})")
            else:
                if not low_mw <= gpu.power_limit_w * 1000 <= high_mw:
                    allowed = f"{low_mw / 1000:g}-{high_mw / 1000:g} W"
                    problems.append(f"power limit {gpu.power_limit_w} W is outside this GPU's {allowed}")
        return problems

    def check_node_settings(self, settings: NodeSettings) -> None:
        gpu, problems = settings.gpu, {}
        if gpu.gpu_clock_min_mhz or gpu.gpu_clock_max_mhz or gpu.power_limit_w is not None:
            for index, handle in enumerate(self._handles()):
                for problem in self._gpu_setting_problems(handle, gpu):
                    problems.setdefault(problem, []).append(index)
        if problems:
            raise ApplyError("; ".join(f"{on_gpus(gpus)}: {text}" for text, gpus in problems.items()))
        self.host.check_tuning(settings.host)

    def apply_node_settings(self, settings: NodeSettings, previous: NodeSettings | None = None) -> list[str]:
        self.check_node_settings(settings)
        done: list[str] = []
        try:
            self._apply_gpu_settings(settings.gpu, previous.gpu if previous else GpuSettings(), done)
            if settings.host.to_dict():
                done += self.host.apply(settings.host)
        except ApplyError as error:
            if done:
                raise ApplyError(f"{error}; changed before that: {', '.join(done)}") from None
            raise
        return done

    def _apply_gpu_settings(self, gpu: GpuSettings, before: GpuSettings, done: list[str]) -> None:
        """Each GPU setting in turn; `done` says what changed so far, for the message when a later step fails."""
        handles = list(enumerate(self._handles()))
        modes_before = [self.nvml.nvmlDeviceGetComputeMode(handle) for _, handle in handles]
        done.extend(self._apply_persistence(gpu))
        done.extend(self._apply_time_slice(gpu, before))
        done.extend(self._apply_compute_mode(gpu, before, handles, modes_before))
        done.extend(self._apply_locked_clocks(gpu, before, handles))
        done.extend(self._apply_power_limit(gpu, before, handles))

    def _apply_persistence(self, gpu: GpuSettings) -> list[str]:
        if gpu.persistence_mode is not None and (changed := self._persistence(gpu.persistence_mode)):
            return [f"persistence mode {'on' if gpu.persistence_mode else 'off'} on {on_gpus(changed)}"]
        return []

    def _apply_time_slice(self, gpu: GpuSettings, before: GpuSettings) -> list[str]:
        if gpu.time_slice_interval is not None:
            self.set_time_slice(gpu.time_slice_interval)  # nvidia-smi cannot be asked what it is: always set
            return [f"time slice {gpu.time_slice_interval}"]
        if before.time_slice_interval is not None:
            self.set_time_slice("default")
            return ["time slice back to default"]
        return []

    def _apply_compute_mode(
        self, gpu: GpuSettings, before: GpuSettings, handles: list[tuple[int, Any]], modes_before: list[int]
    ) -> list[str]:
        nv = self.nvml
        mode = gpu.compute_mode or ("default" if before.compute_mode else None)
        if mode is None:
            return []
        wanted = COMPUTE_MODE_VALUES[mode]
        read, write = nv.nvmlDeviceGetComputeMode, nv.nvmlDeviceSetComputeMode
        self._set_each(f"set compute mode {mode}", read, write, wanted, handles)
        # Against the mode before the time slice step, which passes through DEFAULT (§5).
        changed = [index for index, _ in handles if modes_before[index] != wanted]
        return [f"compute mode {mode} on {on_gpus(changed)}"] if changed else []

    def _apply_locked_clocks(self, gpu: GpuSettings, before: GpuSettings, handles: list[tuple[int, Any]]) -> list[str]:
        nv = self.nvml
        bounds = (gpu.gpu_clock_min_mhz, gpu.gpu_clock_max_mhz)
        before_bounds = (before.gpu_clock_min_mhz, before.gpu_clock_max_mhz)
        if any(bounds):
            ranges = set()
            for index, handle in handles:
                low, high = self._locked_range(handle, gpu)
                what = f"GPU {index}: lock clocks to {low}-{high} MHz"
                call_nvml(what, nv.nvmlDeviceSetGpuLockedClocks, handle, low, high)
                ranges.add(f"{low}-{high} MHz")
            if bounds != before_bounds:  # NVML cannot read locked clocks back; the agent remembers what it set
                return [f"GPU clocks locked to {', '.join(sorted(ranges))}"]
            return []
        if any(before_bounds):
            for index, handle in handles:
                call_nvml(f"GPU {index}: reset locked clocks", nv.nvmlDeviceResetGpuLockedClocks, handle)
            return ["GPU clocks unlocked"]
        return []

    def _apply_power_limit(self, gpu: GpuSettings, before: GpuSettings, handles: list[tuple[int, Any]]) -> list[str]:
        nv = self.nvml
        read, write = nv.nvmlDeviceGetPowerManagementLimit, nv.nvmlDeviceSetPowerManagementLimit
        if gpu.power_limit_w is not None:
            what = f"set power limit {gpu.power_limit_w} W"
            changed = self._set_each(what, read, write, gpu.power_limit_w * 1000, handles)
            return [f"power limit {gpu.power_limit_w} W on {on_gpus(changed)}"] if changed else []
        if before.power_limit_w is not None:
            changed = []
            for index, handle in handles:
                default_mw = nv.nvmlDeviceGetPowerManagementDefaultLimit(handle)
                changed += self._set_each("restore the default power limit", read, write, default_mw, [(index, handle)])
            return [f"power limit back to default on {on_gpus(changed)}"] if changed else []
        return []
