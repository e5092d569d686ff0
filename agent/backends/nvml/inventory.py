"""NVML backend inventory: the GPUs, their MIG mode, GPU instances, MIG devices and processes (§6)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from typing import Any

import pynvml

from agent.backends.base import Backend
from agent.backends.nvml.calls import MIB, Runner, instance_id
from agent.protocol import GpuInstance, GpuProcess, MigDevice
from sharing.mig import UnknownProductError, get_product


def gfd_product(name: str) -> str:
    """The GPU Feature Discovery label of an NVML name (§3.6), in the catalog's spelling when it knows the model."""
    try:
        return get_product(name).name
    except UnknownProductError:
        return name.strip().replace(" ", "-")


class NvmlInventory(Backend):
    """What is on the node, as NVML lists it; the other parts of the backend build on these reads."""

    nvml: Any  # the pynvml module, or the simulated layer
    run: Runner
    which: Callable[[str], str | None]
    host: Any  # agent.host.LinuxHost, or the simulated host

    def _handles(self) -> list[Any]:
        nv = self.nvml
        return [nv.nvmlDeviceGetHandleByIndex(index) for index in range(nv.nvmlDeviceGetCount())]

    def _gpu_inventory(self, index: int, handle: Any) -> dict[str, Any]:
        """The GpuReport fields that say what the GPU is, how it is partitioned and what runs on it."""
        nv = self.nvml
        name = nv.nvmlDeviceGetName(handle)
        pci = nv.nvmlDeviceGetPciInfo(handle)
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        current, pending = self._mig_mode(handle)
        instances = [gi for _, gi in self._gpu_instances(handle)] if current else []
        return {
            "uuid": nv.nvmlDeviceGetUUID(handle),
            "index": index,
            "name": name,
            "product": gfd_product(name),
            "pci_bus_id": pci.busId,
            "pci_device_id": f"0x{pci.pciDeviceId:08X}",
            "numa_node": self._numa_node(handle, pci.busId),
            "memory_total_mib": memory.total // MIB,
            "memory_used_mib": memory.used // MIB,
            "mig_capable": current is not None,
            "mig_mode_current": current,
            "mig_mode_pending": pending,
            "gpu_instances": tuple(instances),
            "mig_devices": tuple(self._mig_devices(handle, instances)) if current else (),
            "processes": tuple(self._processes(handle)),
        }

    def _numa_node(self, handle: Any, pci_bus_id: str) -> int | None:
        try:
            node = self.nvml.nvmlDeviceGetNumaNodeId(handle)
        except pynvml.NVMLError:  # older drivers lack the call (FunctionNotFound) or the value (NotSupported)
            node = self.host.pci_numa_node(pci_bus_id)
        return node if node is not None and node >= 0 else None

    def _mig_mode(self, handle: Any) -> tuple[bool | None, bool | None]:
        """(current, pending) MIG mode; (None, None) on a GPU without MIG. Pending ≠ current until a reset (§1.3)."""
        try:
            current, pending = self.nvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError_NotSupported:
            return None, None
        return current == pynvml.NVML_DEVICE_MIG_ENABLE, pending == pynvml.NVML_DEVICE_MIG_ENABLE

    def _gi_profiles(self, handle: Any) -> dict[int, Any]:
        """GPU-instance profile infos by profile ID, as the driver reports them: names are never assumed (§4)."""
        profiles = {}
        for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue  # not a profile of this GPU, or an index newer than the driver
            profiles.setdefault(info.id, info)
        return profiles

    def _gpu_instances(self, handle: Any) -> list[tuple[Any, GpuInstance]]:
        """(NVML handle, report) of every GPU instance, in placement order."""
        nv = self.nvml
        found = []
        for profile_id, info in self._gi_profiles(handle).items():
            if not info.instanceCount:
                continue
            count = ctypes.c_uint(info.instanceCount)
            array = (pynvml.c_nvmlGpuInstance_t * info.instanceCount)()
            nv.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.byref(count))
            for gpu_instance in array[: count.value]:
                gi = nv.nvmlGpuInstanceGetInfo(gpu_instance)
                report = GpuInstance(
                    profile=info.name.removeprefix("MIG "),
                    profile_id=profile_id,
                    start=gi.placement.start,
                    size=gi.placement.size,
                    gpu_instance_id=gi.id,
                )
                found.append((gpu_instance, report))
        return sorted(found, key=lambda pair: (pair[1].start, pair[1].gpu_instance_id))

    def _mig_devices(self, handle: Any, instances: list[GpuInstance]) -> list[MigDevice]:
        nv = self.nvml
        by_id = {gi.gpu_instance_id: gi for gi in instances}
        devices = []
        for slot in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError_NotFound:
                continue  # an empty slot
            gi = by_id[nv.nvmlDeviceGetGpuInstanceId(mig)]
            attributes = nv.nvmlDeviceGetAttributes(mig)
            profile = gi.profile
            if attributes.computeInstanceSliceCount != attributes.gpuInstanceSliceCount:
                profile = f"{attributes.computeInstanceSliceCount}c.{gi.profile}"  # a CI smaller than its GI (§2.1)
            devices.append(
                MigDevice(
                    uuid=nv.nvmlDeviceGetUUID(mig),
                    profile=profile,
                    start=gi.start,
                    size=gi.size,
                    gpu_instance_id=gi.gpu_instance_id,
                    compute_instance_id=nv.nvmlDeviceGetComputeInstanceId(mig),
                    memory_mib=nv.nvmlDeviceGetMemoryInfo(mig).total // MIB,
                )
            )
        return sorted(devices, key=lambda device: (device.start, device.compute_instance_id))

    def _processes(self, handle: Any) -> list[GpuProcess]:
        return [
            GpuProcess(
                pid=process.pid,
                used_memory_mib=process.usedGpuMemory // MIB if process.usedGpuMemory is not None else None,
                gpu_instance_id=instance_id(process.gpuInstanceId),
                compute_instance_id=instance_id(process.computeInstanceId),
            )
            for process in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ]

    def busy_processes(self, gpu_uuids: Iterable[str]) -> list[tuple[str, int]]:
        nv = self.nvml
        busy = []
        for uuid in gpu_uuids:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            busy.extend((uuid, process.pid) for process in nv.nvmlDeviceGetComputeRunningProcesses(handle))
        return busy
