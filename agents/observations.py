"""What an agent's report means for the inventory: the observations `inventory_record` takes from every source (as
from Kubernetes), the resources the node offers, the config it runs, its settings' changes, and the words of its
XID events. Reads no rows and writes none."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils import timezone

from agent.protocol import AppliedState, GpuReport, Report
from fleet.choices import ConfigState, SharingMode
from fleet.health import gpu_health, xid_words
from fleet.models import Gpu, Node
from fleet.observations import GpuObservation, MigDeviceObservation, NodeObservation
from sharing.mig import get_product
from sharing.mig.catalog import UnknownProductError
from sharing.render import GPU_RESOURCE, DevicePluginSpec, parse_device_plugin_config


def xid_message(xid: int) -> str:
    """The message of an XID event: what it is and what an admin does about it."""
    return f"XID {xid}: {xid_words(xid)}"


def _mig_resource(product: str, profile: str) -> str:
    try:
        found = get_product(product).mig_profile(profile)
    except UnknownProductError:
        found = None
    return found.resource_name if found else "nvidia.com/mig-" + profile.replace("+", ".")


def observed_allocatable(
    gpus: Sequence[GpuReport], applied: AppliedState | None, plugin: DevicePluginSpec | None
) -> dict[str, int]:
    """The GPU resources the node offers as reported: MIG devices that exist, whole GPUs times the replicas the
    node runs (MPS from the report; time-slicing from the applied config), named by the applied config's rules."""
    totals: dict[str, int] = {}
    for gpu in gpus:
        if gpu.mig_mode_current:
            for device in gpu.mig_devices:
                name = _mig_resource(gpu.product, device.profile)
                totals[name] = totals.get(name, 0) + 1
        else:
            totals[GPU_RESOURCE] = totals.get(GPU_RESOURCE, 0) + 1
    if plugin is not None and plugin.mig_strategy == "single" and totals:
        totals = {GPU_RESOURCE: sum(totals.values())}
    replicas = 1
    if applied is not None and applied.mps is not None:
        replicas = applied.mps.replicas
    elif applied is not None and applied.time_slice is not None and plugin is not None and plugin.sharing:
        replicas = plugin.replicas
    if replicas > 1:
        suffix = ".shared" if plugin is not None and plugin.rename_by_default else ""
        totals = {name + suffix: count * replicas for name, count in totals.items()}
    return dict(sorted(totals.items()))


def _observed_mode(report: Report) -> str:
    if any(g.mig_mode_current for g in report.gpus):
        return SharingMode.MIG
    if report.applied is not None and report.applied.mps is not None:
        return SharingMode.MPS
    if report.applied is not None and report.applied.time_slice is not None:
        return SharingMode.TIME_SLICING
    return SharingMode.PASSTHROUGH


def _plugin(to_config: dict | None) -> DevicePluginSpec | None:
    try:
        return parse_device_plugin_config(to_config.get("device_plugin", "")) if to_config else None
    except ValueError:
        return None


def _in_use_by(gpu: GpuReport, gpu_instance_id: int | None, compute_instance_id: int | None) -> str:
    pids = sorted(
        p.pid
        for p in gpu.processes
        if p.gpu_instance_id == gpu_instance_id and p.compute_instance_id in (None, compute_instance_id)
    )
    return ", ".join(f"pid {pid}" for pid in pids)[:300]


def _mig_devices(gpu: GpuReport) -> tuple[MigDeviceObservation, ...]:
    if not gpu.mig_mode_current:
        return ()
    devices, starts = [], set()
    for d in sorted(gpu.mig_devices, key=lambda d: (d.start, d.compute_instance_id)):
        if d.start in starts:
            continue  # a second compute instance of one GPU instance: Tessera tracks one device per placement
        starts.add(d.start)
        devices.append(
            MigDeviceObservation(
                profile=d.profile,
                start=d.start,
                size=d.size,
                uuid=d.uuid,
                gpu_instance_id=d.gpu_instance_id,
                compute_instance_id=d.compute_instance_id,
                memory_mib=d.memory_mib,
                in_use_by=_in_use_by(gpu, d.gpu_instance_id, d.compute_instance_id),
            )
        )
    return tuple(devices)


def _labels(report: Report) -> dict[str, str]:
    """GPU Feature Discovery's main labels, so selector pools work for agent clusters too (contracts §3.6)."""
    if not report.gpus:
        return {}
    first = report.gpus[0]
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": first.product,
        "nvidia.com/gpu.count": str(len(report.gpus)),
        "nvidia.com/gpu.memory": str(first.memory_total_mib),
        "nvidia.com/mig.capable": "true" if first.mig_capable else "false",
    }


def newest_xids(report: Report) -> dict[str, tuple[int, datetime | None]]:
    """The newest XID event of each GPU in the report, by GPU UUID: (XID, when; None when unreadable)."""
    newest: dict[str, tuple[int, datetime | None]] = {}
    for event in report.xid_events:
        at = parse_time(event.at)
        current = newest.get(event.gpu_uuid)
        if current is None or (at and (current[1] is None or at >= current[1])):
            newest[event.gpu_uuid] = (event.xid, at)
    return newest


def parse_time(text: str) -> datetime | None:
    """An agent's ISO 8601 time, UTC when it names no zone; None when unreadable."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ConfigView:
    """The config a node runs and its state, as its node row stores them."""

    observed_mig_config: str
    observed_device_plugin_config: str
    config_state: str
    last_error: str


def config_view(node: Node, report: Report, refresh: bool, to_config: dict | None) -> ConfigView:
    """Which config the node runs: from `applied` when it changed (or a change waits for it), else as stored, so a
    failure recorded from an outcome stands until the agent applies something new."""
    if not refresh:
        return ConfigView(
            node.observed_mig_config, node.observed_device_plugin_config, node.config_state, node.last_error
        )
    if report.applied is None:
        return ConfigView("", "", ConfigState.UNKNOWN, "")
    plugin_key = (to_config or {}).get("device_plugin_config", "")
    return ConfigView(report.applied.mig_selected or "", plugin_key, ConfigState.SUCCESS, "")


def gpu_observation(
    gpu: GpuReport, before: Gpu | None, newest_xid: tuple[int, datetime | None] | None
) -> GpuObservation:
    """A reported GPU as `inventory_record` takes it; its health from the newest XID and uncorrectable ECC count,
    each the stored one (`before`) when the report has none."""
    last_xid = newest_xid[0] if newest_xid is not None else (before.last_xid if before else None)
    dbe = gpu.ecc_dbe_total if gpu.ecc_dbe_total is not None else (before.ecc_dbe_total if before else 0)
    return GpuObservation(
        index=gpu.index,
        uuid=gpu.uuid,
        product=gpu.product,
        memory_mib=gpu.memory_total_mib,
        pci_bus_id=gpu.pci_bus_id,
        pci_device_id=gpu.pci_device_id,
        numa_node=gpu.numa_node,
        mig_capable=gpu.mig_capable,
        mig_enabled=bool(gpu.mig_mode_current),
        mig_pending=gpu.mig_mode_pending if gpu.mig_mode_pending != gpu.mig_mode_current else None,
        health=gpu_health(last_xid=last_xid, ecc_dbe_total=dbe),
        mig_devices=_mig_devices(gpu),
        settings=_gpu_settings(gpu),
    )


def node_observation(
    node: Node, report: Report, view: ConfigView, gpus: Sequence[GpuObservation], to_config: dict | None
) -> NodeObservation:
    """The reported node as `inventory_record` takes it: ready (it just called), labelled as GPU Feature Discovery
    would, offering what its GPUs and the applied config (`to_config`, when the server has it) make of them."""
    return NodeObservation(
        name=node.name,
        labels=_labels(report),
        ready=True,
        allocatable=observed_allocatable(report.gpus, report.applied, _plugin(to_config)),
        driver_version=report.driver_version[:50],
        cuda_version=report.cuda_version[:20],
        numa_nodes=report.numa_nodes,
        observed_mode=_observed_mode(report),
        observed_mig_config=view.observed_mig_config,
        observed_device_plugin_config=view.observed_device_plugin_config,
        config_state=view.config_state,
        last_error=view.last_error,
        gpus=tuple(gpus),
        host_settings=report.host.to_dict(),
    )


def _gpu_settings(gpu: GpuReport) -> dict:
    """The GPU's settings a QoS policy sets, as read (null where unreadable or from an older agent): what
    Gpu.settings stores. Not the graphics clock now (it moves with load); NVML cannot read locked clocks back."""
    return {
        "compute_mode": gpu.compute_mode,
        "persistence_mode": gpu.persistence_mode,
        "power_limit_w": gpu.power_limit_w,
        "applications_clock_mhz": gpu.applications_clock_mhz,
        "max_graphics_clock_mhz": gpu.max_graphics_clock_mhz,
    }


def applied_node_settings(report: Report) -> dict | None:
    """The QoS node settings the agent last applied, as desired ({gpu, host}): what Node.agent_node_settings stores."""
    applied = report.applied
    return applied.node_settings.to_dict() if applied is not None and applied.node_settings is not None else None


def _index_ranges(indexes: Sequence[int]) -> str:
    """[0, 1, 2, 3, 5] -> "0-3,5"."""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def settings_changes(
    host_before: dict | None, host: dict, gpus_before: dict[str, dict | None], gpus: Sequence[GpuObservation]
) -> tuple[dict, dict]:
    """The reported settings that went from one value to another, as flat (before, after) dicts for the audit log:
    `host.<key>` and `gpu<indexes>.<key>`, one key for the GPUs that made the same change (`gpu0-7.power_limit_w`).
    A setting seen for the first time, or unreadable before or now, is not a change."""
    before, after = {}, {}
    for key, value in host.items():
        old = (host_before or {}).get(key)
        if old is not None and value is not None and old != value:
            before[f"host.{key}"], after[f"host.{key}"] = old, value
    changed: dict[tuple, list[int]] = {}
    for gpu in gpus:
        old_settings = gpus_before.get(gpu.uuid) or {}
        for key, value in (gpu.settings or {}).items():
            old = old_settings.get(key)
            if old is not None and value is not None and old != value:
                changed.setdefault((key, old, value), []).append(gpu.index)
    for (key, old, value), indexes in changed.items():
        name = f"gpu{_index_ranges(indexes)}.{key}"
        before[name], after[name] = old, value
    return before, after
