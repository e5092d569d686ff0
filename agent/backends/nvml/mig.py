"""NVML backend MIG: check a mig-parted config against the GPUs, then apply it with mig-parted or NVML (§1-§4)."""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pynvml

from agent.backends.base import MigPlan, MigTarget
from agent.backends.nvml.calls import call_nvml, last_line
from agent.backends.nvml.inventory import NvmlInventory
from agent.errors import ApplyError
from agent.protocol import MigSettings
from sharing.mig import UnknownProductError, get_product, validate_layout
from sharing.nvidia_configs import device_filter_matches
from sharing.render import MigDeviceSpec, parse_mig_parted_config

# The compute-instance profile that spans a whole GPU instance of that many compute slices (mig-parted's -C).
CI_PROFILE_BY_SLICES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}


def _spec_for(specs: list[MigDeviceSpec], index: int, pci: Any) -> MigDeviceSpec | None:
    """The entry of a mig-parted config that covers this GPU; later entries win, as mig-parted applies in order."""
    chosen = None
    for spec in specs:
        if spec.devices != "all" and index not in spec.devices:
            continue
        if not device_filter_matches(spec.device_filter, pci.pciDeviceId, pci.pciSubSystemId):
            continue
        chosen = spec
    return chosen


class NvmlMig(NvmlInventory):
    """MIG changes: validated for every GPU before anything is touched, then applied GPU by GPU."""

    def plan_mig(self, mig: MigSettings) -> MigPlan:
        nv = self.nvml
        try:
            configs = parse_mig_parted_config(mig.mig_parted_config)
        except ValueError as error:
            raise ApplyError(f"the mig-parted config is invalid: {error}") from None
        if mig.selected not in configs:
            raise ApplyError(f"the mig-parted config has no config named {mig.selected!r}")
        targets, problems = [], {}  # problem -> GPU indices, so eight identical GPUs give one sentence
        for index, handle in enumerate(self._handles()):
            pci = nv.nvmlDeviceGetPciInfo(handle)
            spec = _spec_for(configs[mig.selected], index, pci)
            if spec is None:
                continue
            name = nv.nvmlDeviceGetName(handle)
            current, pending = self._mig_mode(handle)
            if current is None:
                # mig-parted skips GPUs without MIG for `devices: all` and for MIG off; anything else is an error.
                if spec.mig_enabled and spec.devices != "all":
                    problems.setdefault(f"{name} does not support MIG", []).append(index)
                continue
            devices = {profile: count for profile, count in spec.mig_devices.items() if count}
            placements = ()
            if spec.mig_enabled:
                try:
                    result = validate_layout(get_product(name), devices)
                except UnknownProductError:
                    unknown = f"{name} is not in Tessera's MIG catalog, so no layout can be placed"
                    problems.setdefault(unknown, []).append(index)
                    continue
                if not result.valid:
                    problems.setdefault("; ".join(result.errors), []).append(index)
                    continue
                placements = result.placements
            mode_change = current != spec.mig_enabled or pending != spec.mig_enabled
            layout_change = spec.mig_enabled and (mode_change or self._device_counts(handle) != devices)
            targets.append(
                MigTarget(
                    index=index,
                    uuid=nv.nvmlDeviceGetUUID(handle),
                    pci_bus_id=pci.busId,
                    enabled=spec.mig_enabled,
                    devices=devices,
                    placements=placements,
                    mode_change=mode_change,
                    layout_change=layout_change,
                )
            )
        if problems:
            raise ApplyError("; ".join(f"GPU {', '.join(map(str, gpus))}: {text}" for text, gpus in problems.items()))
        return MigPlan(selected=mig.selected, config_text=mig.mig_parted_config, targets=tuple(targets))

    def _device_counts(self, handle: Any) -> dict[str, int] | None:
        """Profile counts of the MIG devices present, like `mig-parted assert` (placements do not matter); None when
        a GPU instance lacks its compute instance, which no desired layout matches."""
        instances = [gi for _, gi in self._gpu_instances(handle)]
        devices = Counter(device.profile for device in self._mig_devices(handle, instances))
        return dict(devices) if sum(devices.values()) == len(instances) else None

    def apply_mig(self, plan: MigPlan) -> None:
        mig_parted = self.which("nvidia-mig-parted")
        if mig_parted:
            self._apply_with_mig_parted(mig_parted, plan)
            self._raise_if_pending(plan.changed)
        else:
            self._apply_with_nvml(plan)

    def _apply_with_mig_parted(self, mig_parted: str, plan: MigPlan) -> None:
        """`nvidia-mig-parted apply -f <file> -c <name>` (§2.2): it sets modes, resets and creates the devices."""
        with tempfile.NamedTemporaryFile("w", prefix="tessera-mig-", suffix=".yaml", delete=False) as file:
            file.write(plan.config_text)
        try:
            result = self.run([mig_parted, "apply", "-f", file.name, "-c", plan.selected])
        finally:
            os.unlink(file.name)
        if result.returncode != 0:
            raise ApplyError(f"nvidia-mig-parted apply failed (exit {result.returncode}): {last_line(result)}")

    def _apply_with_nvml(self, plan: MigPlan) -> None:
        """What mig-parted does (§1.2 steps 9-10, apply/mode.go), through NVML, when its binary is not installed."""
        nv = self.nvml
        mode_changes = [target for target in plan.changed if target.mode_change]
        for target in mode_changes:
            handle = nv.nvmlDeviceGetHandleByIndex(target.index)
            if self._mig_mode(handle)[0]:
                self._clear_mig(target.index, handle)
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if target.enabled else pynvml.NVML_DEVICE_MIG_DISABLE
            call_nvml(f"GPU {target.index}: set MIG mode", nv.nvmlDeviceSetMigMode, handle, mode)
        pending = [t for t in mode_changes if self._mig_mode(nv.nvmlDeviceGetHandleByIndex(t.index))[0] != t.enabled]
        reset_problem = self._reset([target.pci_bus_id for target in pending]) if pending else ""
        self._raise_if_pending(pending, reset_problem)
        for target in plan.changed:
            if target.enabled and target.layout_change:
                self._create_layout(target, nv.nvmlDeviceGetHandleByIndex(target.index))

    def _reset(self, pci_bus_ids: list[str]) -> str:
        """Reset GPUs whose MIG mode is pending, as mig-parted does with `nvidia-smi -r -i` (§1.3); '' on success.

        mig-parted resets every GPU; only the GPUs that changed mode are reset here, so the others keep their work.
        """
        smi = self.which("nvidia-smi")
        if smi is None:
            return "nvidia-smi not found to reset the GPU"
        result = self.run([smi, "-r", "-i", ",".join(pci_bus_ids)])
        return "" if result.returncode == 0 else f"nvidia-smi -r failed: {last_line(result)}"

    def _raise_if_pending(self, targets: Iterable[MigTarget], reset_problem: str = "") -> None:
        nv = self.nvml
        pending = [t for t in targets if self._mig_mode(nv.nvmlDeviceGetHandleByIndex(t.index))[0] != t.enabled]
        if pending:
            gpus = ", ".join(str(target.index) for target in pending)
            detail = f" ({reset_problem})" if reset_problem else ""
            raise ApplyError(f"MIG mode change on GPU {gpus} is pending: it needs a GPU reset or a reboot{detail}")

    def _clear_mig(self, index: int, handle: Any) -> None:
        """Destroy every compute and GPU instance, compute instances first (NVML refuses the reverse)."""
        nv = self.nvml
        for gpu_instance, gi in self._gpu_instances(handle):
            for ci_profile in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                try:
                    info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                        gpu_instance, ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                    )
                except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                    continue
                count = ctypes.c_uint(info.instanceCount)
                array = (pynvml.c_nvmlComputeInstance_t * info.instanceCount)()
                nv.nvmlGpuInstanceGetComputeInstances(gpu_instance, info.id, array, ctypes.byref(count))
                for compute_instance in array[: count.value]:
                    what = f"GPU {index}: destroy a compute instance of {gi.profile} at {gi.start}"
                    call_nvml(what, nv.nvmlComputeInstanceDestroy, compute_instance)
            what = f"GPU {index}: destroy {gi.profile} at {gi.start}"
            call_nvml(what, nv.nvmlGpuInstanceDestroy, gpu_instance)

    def _create_layout(self, target: MigTarget, handle: Any) -> None:
        """Create the catalog's placements, after checking the driver knows each profile and placement (§4)."""
        nv = self.nvml
        profiles = {info.name.removeprefix("MIG "): info for info in self._gi_profiles(handle).values()}
        for placement in target.placements:
            info = profiles.get(placement.profile)
            if info is None:
                known = ", ".join(sorted(profiles))
                raise ApplyError(f"GPU {target.index}: the driver has no profile {placement.profile} (it has {known})")
            count = ctypes.c_uint()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, None, ctypes.byref(count))
            possible = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, possible, ctypes.byref(count))
            if (placement.start, placement.size) not in {(p.start, p.size) for p in possible[: count.value]}:
                raise ApplyError(
                    f"GPU {target.index}: the driver does not allow {placement.profile} at "
                    f"{placement.start}:{placement.size}; the MIG catalog disagrees with this GPU"
                )
        self._clear_mig(target.index, handle)
        for placement in target.placements:
            info = profiles[placement.profile]
            where = f"GPU {target.index}: create {placement.profile} at {placement.start}"
            position = pynvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
            gpu_instance = call_nvml(
                where, nv.nvmlDeviceCreateGpuInstanceWithPlacement, handle, info.id, ctypes.byref(position)
            )
            ci_info = call_nvml(
                where,
                nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gpu_instance,
                CI_PROFILE_BY_SLICES[info.sliceCount],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            call_nvml(where, nv.nvmlGpuInstanceCreateComputeInstance, gpu_instance, ci_info.id)
