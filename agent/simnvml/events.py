"""Simulated NVML events: event sets the backend registers GPUs on, and the XID errors queued to them (§6, §10)."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from agent.simnvml.base import SimNvmlBase
from agent.simnvml.devices import NOT_AVAILABLE, EventSet, SimGpu, nvml_error


class SimEvents(SimNvmlBase):
    """nvmlEventSet* and nvmlDeviceRegisterEvents; a simulated wait never blocks."""

    def _queue_xid(self, gpu: SimGpu, xid: int, gpu_instance_id: int | None, compute_instance_id: int | None) -> None:
        """Queue an XID critical error on every event set that listens to this GPU for them."""
        for event_set in self._event_sets:
            if event_set.registered.get(gpu.index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                data = pynvml.c_nvmlEventData_t()
                data.device = ctypes.pointer(gpu.handle)
                data.eventType = pynvml.nvmlEventTypeXidCriticalError
                data.eventData = xid
                data.gpuInstanceId = NOT_AVAILABLE if gpu_instance_id is None else gpu_instance_id
                data.computeInstanceId = NOT_AVAILABLE if compute_instance_id is None else compute_instance_id
                event_set.queue.append(data)

    def nvmlEventSetCreate(self) -> Any:
        self._check_initialized()
        event_set = EventSet()
        self._event_sets.append(event_set)
        self._register(event_set.handle, event_set)
        return ctypes.pointer(event_set.handle)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._gpu(handle)
        target = self._resolve(event_set, EventSet)
        target.registered[gpu.index] = target.registered.get(gpu.index, 0) | event_types

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> pynvml.c_nvmlEventData_t:
        """The next queued event; a simulated wait never blocks, it times out at once when nothing is queued."""
        target = self._resolve(event_set, EventSet)
        if not target.queue:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return target.queue.popleft()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        target = self._resolve(event_set, EventSet)
        self._event_sets.remove(target)
        self._forget(target.handle)
