"""NVML backend reports: the node snapshot with each GPU's metrics, and XID events since the last report (§6, §10)."""

from __future__ import annotations

import datetime
from typing import Any

import pynvml

from agent.backends.base import NodeSnapshot
from agent.backends.nvml.calls import COMPUTE_MODES, instance_id, read_metric
from agent.backends.nvml.inventory import NvmlInventory
from agent.protocol import GpuReport, XidEvent

XID_WAIT_MS = 20  # the first wait on the event set; later ones do not block


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class NvmlMetrics(NvmlInventory):
    """What the agent reports: inventory and metrics of every GPU, and the XID errors NVML delivered."""

    _event_set: Any  # the XID event set, registered at start-up; None once closed

    def snapshot(self) -> NodeSnapshot:
        nv = self.nvml
        cuda = nv.nvmlSystemGetCudaDriverVersion()  # 12080 means 12.8
        return NodeSnapshot(
            hostname=self.host.hostname(),
            boot_id=self.host.boot_id(),
            driver_version=nv.nvmlSystemGetDriverVersion(),
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}",
            numa_nodes=self.host.numa_nodes(),
            gpus=tuple(self._gpu_report(index, handle) for index, handle in enumerate(self._handles())),
            host=self.host.settings(),
        )

    def _gpu_report(self, index: int, handle: Any) -> GpuReport:
        return GpuReport(**self._gpu_inventory(index, handle), **self._gpu_metrics(handle))

    def _gpu_metrics(self, handle: Any) -> dict[str, Any]:
        """The GpuReport fields NVML measures now, and the settings it reads back; unknown where it cannot read."""
        nv = self.nvml
        utilization = read_metric(nv.nvmlDeviceGetUtilizationRates, handle)  # NotSupported with MIG enabled (§6)
        power_mw = read_metric(nv.nvmlDeviceGetPowerUsage, handle)
        power_limit_mw = read_metric(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
        persistence = read_metric(nv.nvmlDeviceGetPersistenceMode, handle)
        applications_clock = getattr(nv, "nvmlDeviceGetApplicationsClock", None)
        return {
            "utilization_pct": float(utilization.gpu) if utilization is not None else None,
            "temperature_c": read_metric(nv.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "ecc_sbe_total": self._ecc_errors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            "ecc_dbe_total": self._ecc_errors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            "compute_mode": COMPUTE_MODES.get(read_metric(nv.nvmlDeviceGetComputeMode, handle)),
            "persistence_mode": persistence == pynvml.NVML_FEATURE_ENABLED if persistence is not None else None,
            "power_limit_w": power_limit_mw / 1000 if power_limit_mw is not None else None,
            "graphics_clock_mhz": read_metric(nv.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_GRAPHICS),
            "applications_clock_mhz": read_metric(applications_clock, handle, pynvml.NVML_CLOCK_GRAPHICS),
            "max_graphics_clock_mhz": read_metric(nv.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_GRAPHICS),
        }

    def _ecc_errors(self, handle: Any, error_type: int) -> int | None:
        """Errors since the last reset or reboot, the counters dcgm-exporter exports as *_VOL_TOTAL (§10)."""
        return read_metric(self.nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, pynvml.NVML_VOLATILE_ECC)

    # -- XID events (§6 event set, §10 codes) ----------------------------------------------------------------------

    def _register_xid_events(self) -> Any:
        """Listen from start-up, so an XID between start and the first report is not lost."""
        nv = self.nvml
        event_set = nv.nvmlEventSetCreate()
        for handle in self._handles():
            try:
                nv.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError:
                continue  # a GPU that cannot deliver XID events (NotSupported in vGPU guests) still gets reported
        return event_set

    def drain_xid_events(self) -> list[XidEvent]:
        nv = self.nvml
        events = []
        timeout_ms = XID_WAIT_MS
        while True:
            try:
                data = nv.nvmlEventSetWait(self._event_set, timeout_ms)
            except pynvml.NVMLError_Timeout:
                return events
            timeout_ms = 0
            events.append(
                XidEvent(
                    gpu_uuid=nv.nvmlDeviceGetUUID(data.device),
                    xid=data.eventData,
                    at=_now(),
                    gpu_instance_id=instance_id(data.gpuInstanceId),
                    compute_instance_id=instance_id(data.computeInstanceId),
                )
            )
