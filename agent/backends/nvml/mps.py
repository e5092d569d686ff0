"""NVML backend sharing of whole GPUs: MPS, time-slicing, compute mode and persistence (§3.3, §5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from agent.backends.nvml.calls import COMPUTE_MODES, MIB, call_nvml, last_line
from agent.backends.nvml.inventory import NvmlInventory
from agent.errors import ApplyError
from agent.protocol import MpsSettings, TimeSliceInterval

TIME_SLICES = {"default": 0, "short": 1, "medium": 2, "long": 3}  # §5, NVIDIA's DRA driver TimeSliceInterval.Int()


class NvmlMps(NvmlInventory):
    """The MPS control daemon and the time slice through NVIDIA's tools; compute and persistence mode through NVML."""

    def _tool(self, name: str) -> str:
        path = self.which(name)
        if path is None:
            raise ApplyError(f"{name} is not installed on this host")
        return path

    def _check_run(self, what: str, argv: list[str], input: str | None = None) -> None:
        result = self.run(argv, input=input)
        if result.returncode != 0:
            raise ApplyError(f"{what} failed (exit {result.returncode}): {last_line(result)}")

    def _whole_gpus(self) -> list[tuple[int, Any]]:
        """GPUs not in MIG mode: MPS and time-slice settings apply to whole GPUs only (§3.3, §5)."""
        return [(index, handle) for index, handle in enumerate(self._handles()) if not self._mig_mode(handle)[0]]

    def _set_compute_mode(self, handle: Any, index: int, mode: int) -> None:
        if self.nvml.nvmlDeviceGetComputeMode(handle) != mode:
            what = f"GPU {index}: set compute mode {COMPUTE_MODES[mode]}"
            call_nvml(what, self.nvml.nvmlDeviceSetComputeMode, handle, mode)

    def apply_mps(self, mps: MpsSettings | None) -> None:
        nv = self.nvml
        control = self._tool("nvidia-cuda-mps-control") if mps else self.which("nvidia-cuda-mps-control")
        if control:
            # A running server keeps the defaults it started with, so new settings need a fresh daemon. `quit`
            # fails when none runs, which is fine.
            self.run([control], input="quit\n")
        gpus = self._whole_gpus()
        if mps is None:
            for index, handle in gpus:  # the device plugin's daemon restores DEFAULT when it stops (§3.3)
                if nv.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
                    self._set_compute_mode(handle, index, pynvml.NVML_COMPUTEMODE_DEFAULT)
            return
        for index, handle in gpus:  # MPS needs EXCLUSIVE_PROCESS (§3.3, §5)
            self._set_compute_mode(handle, index, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
        self._check_run("starting the MPS control daemon", [control, "-d"])
        # One command per call, as NVIDIA's device plugin sends them (§5).
        percentage = mps.default_active_thread_percentage or max(1, 100 // mps.replicas)
        commands = [f"set_default_active_thread_percentage {percentage}"]
        for index, handle in gpus:
            total_mib = nv.nvmlDeviceGetMemoryInfo(handle).total // MIB
            limit = mps.pinned_device_memory_limit_mib or total_mib // mps.replicas
            commands.append(f"set_default_device_pinned_mem_limit {index} {limit}M")
        for command in commands:
            self._check_run(f"nvidia-cuda-mps-control {command}", [control], input=command + "\n")

    def mps_running(self) -> bool:
        control = self.which("nvidia-cuda-mps-control")
        return control is not None and self.run([control], input="get_server_list\n").returncode == 0

    def set_time_slice(self, interval: TimeSliceInterval) -> None:
        smi = self._tool("nvidia-smi")
        for index, handle in self._whole_gpus():
            # NVIDIA's DRA driver sets compute mode DEFAULT first, then the time slice (§5).
            self._set_compute_mode(handle, index, pynvml.NVML_COMPUTEMODE_DEFAULT)
            uuid = self.nvml.nvmlDeviceGetUUID(handle)
            argv = [smi, "compute-policy", "-i", uuid, "--set-timeslice", str(TIME_SLICES[interval])]
            self._check_run(f"GPU {index}: set time slice {interval}", argv)

    def set_persistence_mode(self, enabled: bool) -> None:
        self._persistence(enabled)

    def _persistence(self, enabled: bool) -> list[int]:
        nv = self.nvml
        wanted = pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED
        what = f"turn persistence mode {'on' if enabled else 'off'}"
        handles = list(enumerate(self._handles()))
        return self._set_each(what, nv.nvmlDeviceGetPersistenceMode, nv.nvmlDeviceSetPersistenceMode, wanted, handles)

    def _set_each(
        self, what: str, read: Callable[[Any], Any], write: Callable[[Any, Any], Any], wanted: Any, handles: list
    ) -> list[int]:
        """Set a value on every GPU that differs, read it back, and return the indices that changed."""
        changed = []
        for index, handle in handles:
            if read(handle) == wanted:
                continue
            call_nvml(f"GPU {index}: {what}", write, handle, wanted)
            now = read(handle)
            if now != wanted:
                raise ApplyError(f"GPU {index}: {what}: reads {now} after setting {wanted}")
            changed.append(index)
        return changed
