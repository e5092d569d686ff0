"""The real node: NVML through nvidia-ml-py (contracts §6), and NVIDIA's own tools where NVML stops (§2, §5).

`nvml` is the pynvml module on a GPU host; tests pass the simulated layer (agent/simnvml.py), which exposes the same
functions, so this mapping is the code under test. Constants, ctypes structures and error classes always come from
pynvml itself: they need no driver.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pynvml

from agent.backends.base import ApplyError, Backend, BusyError, MigPlan, MigTarget, NodeSnapshot
from agent.host import LinuxHost
from agent.protocol import (
    GpuInstance,
    GpuProcess,
    GpuReport,
    GpuSettings,
    MigDevice,
    MigSettings,
    MpsSettings,
    NodeSettings,
    TimeSliceInterval,
    XidEvent,
)
from sharing.mig import UnknownProductError, get_product, validate_layout
from sharing.render import MigDeviceSpec, parse_mig_parted_config

MIB = 1024 * 1024
NOT_AVAILABLE = 0xFFFFFFFF  # NVML's "no instance" in process and event records (outside MIG)
XID_WAIT_MS = 20  # the first wait on the event set; later ones do not block
COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_thread",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
}
COMPUTE_MODE_VALUES = {name: value for value, name in COMPUTE_MODES.items()}
TIME_SLICES = {"default": 0, "short": 1, "medium": 2, "long": 3}  # §5, NVIDIA's DRA driver TimeSliceInterval.Int()
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
_ERROR_NAMES = {
    value: name for name, value in vars(pynvml).items() if name.startswith("NVML_ERROR_") and isinstance(value, int)
}

Runner = Callable[..., subprocess.CompletedProcess]


def nvml_error_name(error: pynvml.NVMLError) -> str:
    """NVML_ERROR_IN_USE rather than "NVML Error with code 19": pynvml only has text for some codes."""
    return _ERROR_NAMES.get(error.value, f"NVML error {error.value}")


def gfd_product(name: str) -> str:
    """The GPU Feature Discovery label of an NVML name (§3.6), in the catalog's spelling when it knows the model."""
    try:
        return get_product(name).name
    except UnknownProductError:
        return name.strip().replace(" ", "-")


def run_tool(argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    """Run one of NVIDIA's command-line tools, capturing its output for the outcome message."""
    return subprocess.run(argv, input=input, capture_output=True, text=True, timeout=300, check=False)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = (result.stderr or result.stdout or "").strip().splitlines()
    return lines[-1] if lines else "no output"


def _instance_id(value: int) -> int | None:
    return None if value == NOT_AVAILABLE else value


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _metric(call: Callable[..., Any] | None, *args: Any) -> Any:
    """A metric NVML cannot read on this GPU (NotSupported, NoPermission, …) is unknown, not a failed report; so is
    one whose function the bindings no longer have (None: nvmlDeviceGetApplicationsClock is deprecated)."""
    if call is None:
        return None
    try:
        return call(*args)
    except pynvml.NVMLError:
        return None


def _on(indices: list[int]) -> str:
    return "GPU " + ", ".join(map(str, indices))


def _spec_for(specs: list[MigDeviceSpec], index: int, pci: Any) -> MigDeviceSpec | None:
    """The entry of a mig-parted config that covers this GPU; later entries win, as mig-parted applies in order."""
    chosen = None
    for spec in specs:
        if spec.devices != "all" and index not in spec.devices:
            continue
        if spec.device_filter and not any(_filter_matches(item, pci) for item in spec.device_filter):
            continue
        chosen = spec
    return chosen


def _filter_matches(device_filter: str, pci: Any) -> bool:
    device, _, subsystem = device_filter.partition(":")  # 0x<dev><ven>[:0x<subdev><subven>] (§2.1)
    if int(device, 16) != pci.pciDeviceId:
        return False
    return not subsystem or int(subsystem, 16) == pci.pciSubSystemId


class NvmlBackend(Backend):
    """A GPU node driven through NVML, nvidia-mig-parted, nvidia-cuda-mps-control and nvidia-smi."""

    def __init__(
        self,
        nvml: Any = pynvml,
        *,
        run: Runner = run_tool,
        which: Callable[[str], str | None] = shutil.which,
        host: Any = None,
    ):
        self.nvml = nvml
        self.run = run
        self.which = which
        self.host = host if host is not None else LinuxHost()
        nvml.nvmlInit()  # no driver: NVMLError_LibraryNotFound / DriverNotLoaded, for the caller to explain
        self._event_set = self._register_xid_events()

    def close(self) -> None:
        if self._event_set is not None:
            self.nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        self.nvml.nvmlShutdown()

    # -- reading --------------------------------------------------------------------------------------------------

    def _handles(self) -> list[Any]:
        nv = self.nvml
        return [nv.nvmlDeviceGetHandleByIndex(index) for index in range(nv.nvmlDeviceGetCount())]

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
        nv = self.nvml
        name = nv.nvmlDeviceGetName(handle)
        pci = nv.nvmlDeviceGetPciInfo(handle)
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        current, pending = self._mig_mode(handle)
        instances = [gi for _, gi in self._gpu_instances(handle)] if current else []
        utilization = _metric(nv.nvmlDeviceGetUtilizationRates, handle)  # NotSupported with MIG enabled (§6)
        power_mw = _metric(nv.nvmlDeviceGetPowerUsage, handle)
        power_limit_mw = _metric(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
        persistence = _metric(nv.nvmlDeviceGetPersistenceMode, handle)
        return GpuReport(
            uuid=nv.nvmlDeviceGetUUID(handle),
            index=index,
            name=name,
            product=gfd_product(name),
            pci_bus_id=pci.busId,
            pci_device_id=f"0x{pci.pciDeviceId:08X}",
            numa_node=self._numa_node(handle, pci.busId),
            memory_total_mib=memory.total // MIB,
            memory_used_mib=memory.used // MIB,
            mig_capable=current is not None,
            mig_mode_current=current,
            mig_mode_pending=pending,
            gpu_instances=tuple(instances),
            mig_devices=tuple(self._mig_devices(handle, instances)) if current else (),
            processes=tuple(self._processes(handle)),
            utilization_pct=float(utilization.gpu) if utilization is not None else None,
            temperature_c=_metric(nv.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            power_w=power_mw / 1000 if power_mw is not None else None,
            ecc_sbe_total=self._ecc_errors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_dbe_total=self._ecc_errors(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            compute_mode=COMPUTE_MODES.get(_metric(nv.nvmlDeviceGetComputeMode, handle)),
            persistence_mode=persistence == pynvml.NVML_FEATURE_ENABLED if persistence is not None else None,
            power_limit_w=power_limit_mw / 1000 if power_limit_mw is not None else None,
            graphics_clock_mhz=_metric(nv.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_GRAPHICS),
            applications_clock_mhz=_metric(
                getattr(nv, "nvmlDeviceGetApplicationsClock", None), handle, pynvml.NVML_CLOCK_GRAPHICS
            ),
            max_graphics_clock_mhz=_metric(nv.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_GRAPHICS),
        )

    def _ecc_errors(self, handle: Any, error_type: int) -> int | None:
        """Errors since the last reset or reboot, the counters dcgm-exporter exports as *_VOL_TOTAL (§10)."""
        return _metric(self.nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, pynvml.NVML_VOLATILE_ECC)

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
                gpu_instance_id=_instance_id(process.gpuInstanceId),
                compute_instance_id=_instance_id(process.computeInstanceId),
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
                    gpu_instance_id=_instance_id(data.gpuInstanceId),
                    compute_instance_id=_instance_id(data.computeInstanceId),
                )
            )

    # -- MIG -------------------------------------------------------------------------------------------------------

    def _call(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """An NVML call that changes the GPU: IN_USE means busy (§1.2), other errors fail the apply with their name."""
        try:
            return call(*args)
        except pynvml.NVMLError_InUse:
            raise BusyError(f"{what}: the GPU is in use (NVML_ERROR_IN_USE)") from None
        except pynvml.NVMLError_NoPermission:
            raise ApplyError(f"{what}: NVML_ERROR_NO_PERMISSION (the agent must run as root)") from None
        except pynvml.NVMLError_NotSupported:
            raise ApplyError(f"{what}: NVML_ERROR_NOT_SUPPORTED (this GPU or driver cannot do it)") from None
        except pynvml.NVMLError as error:
            raise ApplyError(f"{what}: {nvml_error_name(error)}") from None

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
            raise ApplyError(f"nvidia-mig-parted apply failed (exit {result.returncode}): {_last_line(result)}")

    def _apply_with_nvml(self, plan: MigPlan) -> None:
        """What mig-parted does (§1.2 steps 9-10, apply/mode.go), through NVML, when its binary is not installed."""
        nv = self.nvml
        mode_changes = [target for target in plan.changed if target.mode_change]
        for target in mode_changes:
            handle = nv.nvmlDeviceGetHandleByIndex(target.index)
            if self._mig_mode(handle)[0]:
                self._clear_mig(target.index, handle)
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if target.enabled else pynvml.NVML_DEVICE_MIG_DISABLE
            self._call(f"GPU {target.index}: set MIG mode", nv.nvmlDeviceSetMigMode, handle, mode)
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
        return "" if result.returncode == 0 else f"nvidia-smi -r failed: {_last_line(result)}"

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
                    self._call(what, nv.nvmlComputeInstanceDestroy, compute_instance)
            what = f"GPU {index}: destroy {gi.profile} at {gi.start}"
            self._call(what, nv.nvmlGpuInstanceDestroy, gpu_instance)

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
            gpu_instance = self._call(
                where, nv.nvmlDeviceCreateGpuInstanceWithPlacement, handle, info.id, ctypes.byref(position)
            )
            ci_info = self._call(
                where,
                nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gpu_instance,
                CI_PROFILE_BY_SLICES[info.sliceCount],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            self._call(where, nv.nvmlGpuInstanceCreateComputeInstance, gpu_instance, ci_info.id)

    # -- MPS, time-slicing, persistence (§3.3, §5) -------------------------------------------------------------------

    def _tool(self, name: str) -> str:
        path = self.which(name)
        if path is None:
            raise ApplyError(f"{name} is not installed on this host")
        return path

    def _check_run(self, what: str, argv: list[str], input: str | None = None) -> None:
        result = self.run(argv, input=input)
        if result.returncode != 0:
            raise ApplyError(f"{what} failed (exit {result.returncode}): {_last_line(result)}")

    def _whole_gpus(self) -> list[tuple[int, Any]]:
        """GPUs not in MIG mode: MPS and time-slice settings apply to whole GPUs only (§3.3, §5)."""
        return [(index, handle) for index, handle in enumerate(self._handles()) if not self._mig_mode(handle)[0]]

    def _set_compute_mode(self, handle: Any, index: int, mode: int) -> None:
        if self.nvml.nvmlDeviceGetComputeMode(handle) != mode:
            what = f"GPU {index}: set compute mode {COMPUTE_MODES[mode]}"
            self._call(what, self.nvml.nvmlDeviceSetComputeMode, handle, mode)

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
            self._call(f"GPU {index}: {what}", write, handle, wanted)
            now = read(handle)
            if now != wanted:
                raise ApplyError(f"GPU {index}: {what}: reads {now} after setting {wanted}")
            changed.append(index)
        return changed

    # -- QoS node settings: persistence, compute mode, time slice, clocks, power limit, host tuning -------------------

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
            raise ApplyError("; ".join(f"{_on(gpus)}: {text}" for text, gpus in problems.items()))
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
        nv = self.nvml
        handles = list(enumerate(self._handles()))
        modes_before = [nv.nvmlDeviceGetComputeMode(handle) for _, handle in handles]
        if gpu.persistence_mode is not None and (changed := self._persistence(gpu.persistence_mode)):
            done.append(f"persistence mode {'on' if gpu.persistence_mode else 'off'} on {_on(changed)}")
        if gpu.time_slice_interval is not None:
            self.set_time_slice(gpu.time_slice_interval)  # nvidia-smi cannot be asked what it is: always set
            done.append(f"time slice {gpu.time_slice_interval}")
        elif before.time_slice_interval is not None:
            self.set_time_slice("default")
            done.append("time slice back to default")
        mode = gpu.compute_mode or ("default" if before.compute_mode else None)
        if mode is not None:
            wanted = COMPUTE_MODE_VALUES[mode]
            read, write = nv.nvmlDeviceGetComputeMode, nv.nvmlDeviceSetComputeMode
            self._set_each(f"set compute mode {mode}", read, write, wanted, handles)
            # Against the mode before the time slice step, which passes through DEFAULT (§5).
            changed = [index for index, _ in handles if modes_before[index] != wanted]
            if changed:
                done.append(f"compute mode {mode} on {_on(changed)}")
        bounds, before_bounds = (
            (gpu.gpu_clock_min_mhz, gpu.gpu_clock_max_mhz),
            (before.gpu_clock_min_mhz, before.gpu_clock_max_mhz),
        )
        if any(bounds):
            ranges = set()
            for index, handle in handles:
                low, high = self._locked_range(handle, gpu)
                self._call(
                    f"GPU {index}: lock clocks to {low}-{high} MHz", nv.nvmlDeviceSetGpuLockedClocks, handle, low, high
                )
                ranges.add(f"{low}-{high} MHz")
            if bounds != before_bounds:  # NVML cannot read locked clocks back; the agent remembers what it set
                done.append(f"GPU clocks locked to {', '.join(sorted(ranges))}")
        elif any(before_bounds):
            for index, handle in handles:
                self._call(f"GPU {index}: reset locked clocks", nv.nvmlDeviceResetGpuLockedClocks, handle)
            done.append("GPU clocks unlocked")
        if gpu.power_limit_w is not None:
            what = f"set power limit {gpu.power_limit_w} W"
            limit_mw = gpu.power_limit_w * 1000
            changed = self._set_each(
                what, nv.nvmlDeviceGetPowerManagementLimit, nv.nvmlDeviceSetPowerManagementLimit, limit_mw, handles
            )
            if changed:
                done.append(f"power limit {gpu.power_limit_w} W on {_on(changed)}")
        elif before.power_limit_w is not None:
            changed = []
            for index, handle in handles:
                default_mw = nv.nvmlDeviceGetPowerManagementDefaultLimit(handle)
                read, write = nv.nvmlDeviceGetPowerManagementLimit, nv.nvmlDeviceSetPowerManagementLimit
                changed += self._set_each("restore the default power limit", read, write, default_mw, [(index, handle)])
            if changed:
                done.append(f"power limit back to default on {_on(changed)}")
