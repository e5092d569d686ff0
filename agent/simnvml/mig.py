"""Simulated NVML MIG: MIG mode, GPU instances, compute instances and MIG devices (§1.3, §4.1, §6).

The catalog decides what a GPU allows: a placement it does not list is NVML_ERROR_INVALID_ARGUMENT, an overlap or a
profile over its count INSUFFICIENT_RESOURCES, destroying what a process uses IN_USE.
"""

from __future__ import annotations

import ctypes
import uuid as uuid_module
from typing import Any

import pynvml

from agent.simnvml.base import SimNvmlBase
from agent.simnvml.devices import SimComputeInstance, SimGpu, SimGpuInstance, deref, nvml_error
from sharing.mig import MigProfile

# Compute-instance profile index -> compute slices it spans.
CI_SLICES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}


def gi_profile_index(profile: MigProfile) -> int:
    """The NVML profile index (NVML_GPU_INSTANCE_PROFILE_*) a catalog profile is listed under."""
    if profile.compute_slices == 1:
        if profile.media_extensions:
            return pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
        if profile.memory_slices == 2:
            return pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
        return pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    if profile.compute_slices == 2:
        if profile.media_extensions:
            return pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
        return pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE
    return {
        3: pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
        4: pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
        7: pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
    }[profile.compute_slices]


def _fill_handles(found: list[SimGpuInstance] | list[SimComputeInstance], array: Any, count_ref: Any) -> int:
    """Write the instances' handles into the caller's array and their number into its count, as NVML's C side does."""
    count = deref(count_ref)
    count.value = len(found)
    if len(found) > len(array):
        raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for slot, instance in enumerate(found):
        array[slot] = ctypes.pointer(instance.handle)
    return pynvml.NVML_SUCCESS


class SimMig(SimNvmlBase):
    """The nvmlDevice*/nvmlGpuInstance*/nvmlComputeInstance* functions that read and change MIG."""

    def _mig_capable_gpu(self, handle: Any) -> SimGpu:
        gpu = self._gpu(handle)
        if not gpu.product.mig_capable:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _profile(self, gpu: SimGpu, profile_id: int) -> MigProfile:
        profile = next((p for p in gpu.product.profiles if p.profile_id == profile_id), None)
        if profile is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    # -- MIG mode and GPU instances -------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._mig_capable_gpu(handle)
        return [int(gpu.mig_current), int(gpu.mig_pending)]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        gpu = self._mig_capable_gpu(handle)
        if self._processes(gpu) or gpu.gpu_instances:
            raise nvml_error(pynvml.NVML_ERROR_IN_USE)
        gpu.mig_pending = bool(mode)
        if gpu.mig_pending == gpu.mig_current or self.reset_supported:
            return pynvml.NVML_SUCCESS
        return pynvml.NVML_ERROR_RESET_REQUIRED  # a pass-through VM: only a reboot activates it (§1.3)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        gpu = self._mig_capable_gpu(handle)
        found = next((p for p in gpu.product.profiles if gi_profile_index(p) == profile), None)
        if found is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = found.profile_id
        info.sliceCount = found.compute_slices
        info.instanceCount = found.max_count
        info.multiprocessorCount = found.multiprocessors
        info.copyEngineCount = found.compute_slices
        info.decoderCount = info.jpegCount = info.ofaCount = int(found.media_extensions or found.compute_slices >= 7)
        info.memorySizeMB = found.memory_mib
        info.name = f"MIG {found.name}".encode()
        return info

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        gpu = self._mig_capable_gpu(handle)
        profile = self._profile(gpu, profile_id)
        count = deref(count_ref)
        if placements is None:
            count.value = len(profile.starts)
            return pynvml.NVML_SUCCESS
        if len(placements) < len(profile.starts):
            count.value = len(profile.starts)
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for slot, start in enumerate(profile.starts):
            placements[slot].start, placements[slot].size = start, profile.memory_slices
        count.value = len(profile.starts)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, instances: Any, count_ref: Any) -> int:
        gpu = self._mig_capable_gpu(handle)
        if not gpu.mig_current:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile(gpu, profile_id)
        return _fill_handles([gi for gi in gpu.gpu_instances if gi.profile == profile], instances, count_ref)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> pynvml.c_nvmlGpuInstanceInfo_t:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = ctypes.pointer(gi.gpu.handle)
        info.id, info.profileId = gi.id, gi.profile.profile_id
        info.placement = pynvml.c_nvmlGpuInstancePlacement_t(gi.start, gi.profile.memory_slices)
        return info

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement_ref: Any) -> Any:
        gpu = self._mig_capable_gpu(handle)
        if not gpu.mig_current:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = self._profile(gpu, profile_id)
        placement = deref(placement_ref)
        if placement.start not in profile.starts or placement.size != profile.memory_slices:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a placement this profile has (§4.1)
        new = SimGpuInstance(gpu, 0, profile, placement.start)
        existing = gpu.gpu_instances
        compute = sum(gi.profile.compute_slices for gi in existing) + profile.compute_slices
        if (
            sum(gi.profile == profile for gi in existing) >= profile.max_count
            or (profile.media_extensions and any(gi.profile.media_extensions for gi in existing))
            or compute > gpu.product.compute_slices
            or any(gi.mask & new.mask for gi in existing)
        ):
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        used = {gi.id for gi in existing}
        new.id = 0 if profile.compute_slices == gpu.product.compute_slices else min(set(range(1, 64)) - used)
        existing.append(new)
        self._register(new.handle, new)
        return ctypes.pointer(new.handle)

    def nvmlGpuInstanceDestroy(self, gpu_instance: Any) -> int:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        if gi.compute_instances or any(p.gpu_instance_id == gi.id for p in self._processes(gi.gpu)):
            raise nvml_error(pynvml.NVML_ERROR_IN_USE)
        gi.gpu.gpu_instances.remove(gi)
        self._forget(gi.handle)
        return pynvml.NVML_SUCCESS

    # -- compute instances and MIG devices ---------------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: Any, profile: int, engine_profile: int, version: int = 2
    ) -> Any:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        slices = CI_SLICES.get(profile)
        if (
            engine_profile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            or slices is None
            or slices > gi.profile.compute_slices
        ):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount = profile, slices
        info.instanceCount = gi.profile.compute_slices // slices
        info.multiprocessorCount = gi.profile.multiprocessors * slices // gi.profile.compute_slices
        info.name = f"MIG {slices}c.{gi.profile.name}".encode()
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: Any, profile_id: int) -> Any:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        slices = CI_SLICES.get(profile_id)
        if slices is None or slices > gi.profile.compute_slices:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if sum(ci.slices for ci in gi.compute_instances) + slices > gi.profile.compute_slices:
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gpu = gi.gpu
        gpu.mig_generation += 1  # a recreated MIG device gets a new UUID, as on hardware
        ci_id = min(set(range(8)) - {ci.id for ci in gi.compute_instances})
        mig_uuid = f"MIG-{uuid_module.uuid5(uuid_module.NAMESPACE_OID, f'{gpu.uuid}/{gpu.mig_generation}')}"
        ci = SimComputeInstance(gi, ci_id, profile_id, slices, mig_uuid)
        gi.compute_instances.append(ci)
        self._register(ci.handle, ci)
        self._register(ci.device, ci)
        return ctypes.pointer(ci.handle)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: Any, profile_id: int, instances: Any, count_ref: Any
    ) -> int:
        gi = self._resolve(gpu_instance, SimGpuInstance)
        found = [ci for ci in gi.compute_instances if ci.profile_index == profile_id]
        return _fill_handles(found, instances, count_ref)

    def nvmlComputeInstanceDestroy(self, compute_instance: Any) -> int:
        ci = self._resolve(compute_instance, SimComputeInstance)
        gi = ci.gpu_instance
        if any((p.gpu_instance_id, p.compute_instance_id) == (gi.id, ci.id) for p in self._processes(gi.gpu)):
            raise nvml_error(pynvml.NVML_ERROR_IN_USE)
        gi.compute_instances.remove(ci)
        self._forget(ci.handle)
        self._forget(ci.device)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return self._mig_capable_gpu(handle).product.compute_slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._mig_capable_gpu(handle)
        devices = gpu.compute_instances
        if not 0 <= index < len(devices):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return ctypes.pointer(devices[index].device)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._resolve(handle, SimComputeInstance).gpu_instance.id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._resolve(handle, SimComputeInstance).id

    def nvmlDeviceGetAttributes(self, handle: Any) -> pynvml.c_nvmlDeviceAttributes:
        ci = self._resolve(handle, SimComputeInstance)
        profile = ci.gpu_instance.profile
        attributes = pynvml.c_nvmlDeviceAttributes()
        attributes.multiprocessorCount = profile.multiprocessors * ci.slices // profile.compute_slices
        attributes.sharedCopyEngineCount = profile.compute_slices
        attributes.gpuInstanceSliceCount = profile.compute_slices
        attributes.computeInstanceSliceCount = ci.slices
        attributes.memorySizeMB = profile.memory_mib
        return attributes
