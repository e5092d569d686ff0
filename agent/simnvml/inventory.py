"""Simulated NVML inventory: initialisation, the driver, and each GPU's identity, memory and processes."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from agent.simnvml.base import SimNvmlBase
from agent.simnvml.devices import MIB, NOT_AVAILABLE, SimComputeInstance, SimGpu, nvml_error

DRIVER_VERSION = "570.133.20"
CUDA_DRIVER_VERSION = 12080


class SimInventory(SimNvmlBase):
    """nvmlInit, nvmlSystem* and the nvmlDevice* reads that say what a GPU is and what runs on it."""

    def nvmlInit(self) -> None:
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        self._check_initialized()
        self._initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return DRIVER_VERSION

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return CUDA_DRIVER_VERSION

    def nvmlDeviceGetCount(self) -> int:
        self._check_initialized()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ctypes.pointer(self.gpus[index].handle)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        self._check_initialized()
        gpu = next((gpu for gpu in self.gpus if gpu.uuid == uuid), None)
        if gpu is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
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
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
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
