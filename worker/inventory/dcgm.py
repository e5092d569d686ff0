"""GPUs, MIG devices and metrics from dcgm-exporter's series (contracts §10): Prometheus text or query results.

A GPU without MIG instances has its own rows; a GPU with instances has only per-instance rows (`GPU_I_PROFILE`,
`GPU_I_ID`), each repeating the GPU's device-level fields (temperature, power, XID) and carrying the instance's
own memory and graphics engine activity. `DCGM_FI_DEV_GPU_UTIL` is not supported for MIG instances, so a slice's
utilisation is its `DCGM_FI_PROF_GR_ENGINE_ACTIVE`; the GPU's is the slices' mean weighted by size, its memory in
use their sum.
"""

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fleet.health import HEALTH_FIELDS, gpu_health
from fleet.observations import GpuMetrics, GpuObservation, MigDeviceMetrics, MigDeviceObservation
from sharing.mig import get_product
from sharing.mig.catalog import UnknownProductError
from sharing.mig.placement import validate_layout

GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_FB = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
# Per instance on a MIG GPU; every other wanted field is the GPU's, repeated on each of its instance rows.
_INSTANCE_FIELDS = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", GR_ENGINE_ACTIVE})
WANTED_METRICS = _INSTANCE_FIELDS | HEALTH_FIELDS | {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"}
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _int(value, default=0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass
class InstanceSample:
    """One GPU instance (MIG device) as dcgm-exporter shows it: profile, NVML GPU instance id, user, own values."""

    profile: str
    gi_id: int
    user: str = ""
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class GpuSample:
    """One GPU as dcgm-exporter shows it: its device-level values and its GPU instances by id."""

    index: int
    uuid: str
    pci_bus_id: str = ""
    model: str = ""
    user: str = ""
    values: dict[str, float] = field(default_factory=dict)
    instances: dict[int, InstanceSample] = field(default_factory=dict)


def host_of(labels: dict) -> str:
    """The node a row is from: `hostname` since dcgm-exporter renamed it, `Hostname` in every release before."""
    return labels.get("hostname") or labels.get("Hostname") or ""


def user_of(labels: dict) -> str:
    return f"{labels['namespace']}/{labels['pod']}" if labels.get("namespace") and labels.get("pod") else ""


def text_rows(lines: Iterable[str]) -> Iterator[tuple[dict, dict[str, float]]]:
    """Prometheus text → (labels, {metric: value}) per label set. A lean parser for the few metrics and labels
    used: prometheus_client's parser costs 45–70 µs a sample here, about a minute for the ~950,000 samples of a
    10,000-node fleet; this one 2–4 µs (bench/README.md, B-sync). Label sets are parsed once, not per metric."""
    rows: dict[str, dict[str, float]] = {}
    for line in lines:
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace < 0 or line[:brace] not in WANTED_METRICS:
            continue
        end = line.rfind("}")
        try:
            value = float(line[end + 1 :].split()[0])
        except (ValueError, IndexError):
            continue
        rows.setdefault(line[brace + 1 : end], {})[line[:brace]] = value
    for label_text, values in rows.items():
        yield dict(_LABEL_RE.findall(label_text)), values


def group_samples(rows: Iterable[tuple[dict, dict[str, float]]], host: str = "") -> dict[str, dict[int, GpuSample]]:
    """(labels, values) rows → host → gpu index → sample. `host` names the node every row is from (a scrape of
    one node's exporter pod); else each row's host label does. Rows of one GPU merge: the XID row carries extra
    labels (`err_code`, `err_msg`), a GPU in use one row per pod."""
    nodes: dict[str, dict[int, GpuSample]] = {}
    for labels, values in rows:
        node, uuid, index = host or host_of(labels), labels.get("UUID"), _int(labels.get("gpu"), -1)
        if not node or not uuid or index < 0:
            continue
        gpu = nodes.setdefault(node, {}).get(index)
        if gpu is None or gpu.uuid != uuid:
            gpu = nodes[node][index] = GpuSample(index, uuid)
        gpu.pci_bus_id = gpu.pci_bus_id or labels.get("pci_bus_id", "")
        gpu.model = gpu.model or labels.get("modelName", "")
        user = user_of(labels)
        if labels.get("GPU_I_PROFILE"):
            gi_id = _int(labels.get("GPU_I_ID"), -1)
            instance = gpu.instances.setdefault(gi_id, InstanceSample(labels["GPU_I_PROFILE"], gi_id))
            instance.user = instance.user or user
            for name, value in values.items():
                (instance.values if name in _INSTANCE_FIELDS else gpu.values)[name] = value
        else:
            gpu.user = gpu.user or user
            gpu.values.update(values)
    return nodes


def parse_dcgm(lines: Iterable[str], host: str = "") -> dict[str, dict[int, GpuSample]]:
    """dcgm-exporter's Prometheus text → host → gpu index → sample."""
    return group_samples(text_rows(lines), host)


def _gi_start(product, profile, gi_id: int) -> int | None:
    """Placement start from the GPU-instance id as A100/H100 drivers number them (full 0; 3g/4g 1-2; 2-slice
    3-6; 1g 7-13), or None. Only trusted when it names an allowed start; see mig_devices()."""
    if profile.memory_slices == product.memory_slices:
        return 0 if gi_id == 0 else None
    if profile.compute_slices in (3, 4):
        return (gi_id - 1) * 4 if gi_id in (1, 2) else None
    if profile.memory_slices == 2:
        return (gi_id - 3) * 2 if 3 <= gi_id <= 6 else None
    if profile.memory_slices == 1:
        return gi_id - 7 if 7 <= gi_id <= 13 else None
    return None


def mig_devices(product, instances: Iterable[InstanceSample]) -> tuple[MigDeviceObservation, ...]:
    """MIG devices with placements. dcgm-exporter names profile and GPU-instance id but no placement: the start
    is derived from the id when that gives allowed, non-overlapping starts; otherwise deterministically from the
    catalog's placement of the same profile counts (larger first, lowest start). MIG UUIDs are not exported."""
    rows = [(i.profile, i.gi_id, i.user) for i in instances]
    profiles = [(product.mig_profile(name), gi_id, user) for name, gi_id, user in rows]
    if not rows or any(p is None for p, _, _ in profiles):
        return ()
    placed, used = [], 0
    for profile, gi_id, user in sorted(profiles, key=lambda r: r[1]):
        start = _gi_start(product, profile, gi_id)
        mask = ((1 << profile.memory_slices) - 1) << start if start is not None else 0
        if start is None or start not in profile.starts or used & mask:
            placed = None
            break
        used |= mask
        placed.append((profile, start, gi_id, user))
    if placed is None:
        counts: dict[str, int] = {}
        for profile, _, _ in profiles:
            counts[profile.name] = counts.get(profile.name, 0) + 1
        layout = validate_layout(product, counts)
        if not layout.valid:
            return ()
        by_profile: dict[str, list] = {}
        for profile, gi_id, user in sorted(profiles, key=lambda r: r[1]):
            by_profile.setdefault(profile.name, []).append((profile, gi_id, user))
        placed = []
        for placement in layout.placements:
            profile, gi_id, user = by_profile[placement.profile].pop(0)
            placed.append((profile, placement.start, gi_id, user))
    return tuple(
        MigDeviceObservation(
            profile=profile.name,
            start=start,
            size=profile.memory_slices,
            gpu_instance_id=gi_id if gi_id >= 0 else None,
            memory_mib=profile.memory_mib,
            in_use_by=user,
        )
        for profile, start, gi_id, user in sorted(placed, key=lambda p: p[1])
    )


def _product(label: str, model: str):
    for name in (label, model):
        if name:
            try:
                return get_product(name)
            except UnknownProductError:
                continue
    return None


def _health(values: dict[str, float]) -> str:
    return gpu_health(
        last_xid=_int(values.get("DCGM_FI_DEV_XID_ERRORS")) or None,
        ecc_dbe_total=_int(values.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
        row_remap_failure=_flag(values.get("DCGM_FI_DEV_ROW_REMAP_FAILURE")),
        row_remap_pending=_flag(values.get("DCGM_FI_DEV_ROW_REMAP_PENDING")),
    )


def gpu_observations(product_label: str, samples: dict[int, GpuSample]) -> tuple[GpuObservation, ...]:
    """GPUs of one node from its exporter samples; the product from the node's GFD label (catalog for memory)."""
    gpus = []
    for index in sorted(samples):
        sample = samples[index]
        product = _product(product_label, sample.model)
        values = sample.values
        memory = product.memory_mib if product else sum(filter(None, _memory(sample, *_FB)))
        name = product.name if product else re.sub(r"-(MIG-.*|SHARED)$", "", product_label or sample.model)
        gpus.append(
            GpuObservation(
                index=index,
                uuid=sample.uuid,
                product=name[:100],
                memory_mib=memory,
                pci_bus_id=sample.pci_bus_id,
                pci_device_id=product.pci_device_id if product else "",
                mig_capable=bool(product and product.mig_capable),
                mig_enabled=bool(sample.instances),
                health=_health(values) if values else "unknown",
                mig_devices=mig_devices(product, sample.instances.values()) if product and product.mig_capable else (),
            )
        )
    return tuple(gpus)


def _memory(sample: GpuSample, *names: str) -> list[int | None]:
    """The GPU's own values of `names`, or the sums over its instances (None where no row carries one)."""
    rows = [i.values for i in sample.instances.values()] or [sample.values]
    return [sum(_int(r[n]) for r in rows if n in r) if any(n in r for r in rows) else None for n in names]


def _slice_utilisation(instance: InstanceSample) -> float | None:
    active = instance.values.get(GR_ENGINE_ACTIVE)
    return None if active is None else round(_percent(active * 100), 1)


def _gpu_utilisation(sample: GpuSample, slices: list[tuple[float | None, int]]) -> float | None:
    """The GPU's own utilisation, or its slices' mean weighted by size (slices that report one)."""
    if not sample.instances:
        util = sample.values.get("DCGM_FI_DEV_GPU_UTIL")
        return None if util is None else _percent(util)
    known = [(util, size) for util, size in slices if util is not None]
    if not known:
        return None
    return round(sum(u * size for u, size in known) / sum(size for _, size in known), 1)


def gpu_metrics(scraped: dict[str, dict[int, GpuSample]]) -> list[GpuMetrics]:
    """The utilisation and health sample of each scraped GPU, with its MIG devices' utilisation and memory."""
    samples = []
    for gpus in scraped.values():
        for sample in gpus.values():
            values = sample.values
            if not values and not sample.instances:
                continue
            product = _product("", sample.model) if sample.instances else None
            slices = [(_slice_utilisation(i), _size(product, i)) for i in sample.instances.values()]
            samples.append(
                GpuMetrics(
                    uuid=sample.uuid,
                    utilization_pct=_gpu_utilisation(sample, slices),
                    memory_used_mib=_memory(sample, "DCGM_FI_DEV_FB_USED")[0],
                    temperature_c=values.get("DCGM_FI_DEV_GPU_TEMP"),
                    power_w=values.get("DCGM_FI_DEV_POWER_USAGE"),
                    last_xid=_optional_int(values.get("DCGM_FI_DEV_XID_ERRORS")),
                    ecc_dbe_total=_optional_int(values.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
                    ecc_sbe_total=_optional_int(values.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")),
                    row_remap_failure=_flag(values.get("DCGM_FI_DEV_ROW_REMAP_FAILURE")),
                    row_remap_pending=_flag(values.get("DCGM_FI_DEV_ROW_REMAP_PENDING")),
                    uncorrectable_remapped_rows=_optional_int(values.get("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")),
                    correctable_remapped_rows=_optional_int(values.get("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")),
                    health_signals=tuple(sorted(HEALTH_FIELDS.intersection(values))),
                    mig_devices=tuple(
                        MigDeviceMetrics(
                            gpu_instance_id=instance.gi_id,
                            utilization_pct=util,
                            memory_used_mib=_optional_int(instance.values.get("DCGM_FI_DEV_FB_USED")),
                        )
                        for instance, (util, _) in zip(sample.instances.values(), slices, strict=True)
                        if instance.gi_id >= 0
                    ),
                )
            )
    return samples


def _size(product, instance: InstanceSample) -> int:
    """An instance's size in memory slices, from the catalog (1 when the product or profile is unknown)."""
    profile = product.mig_profile(instance.profile) if product else None
    return profile.memory_slices if profile else 1


def _percent(value: float) -> float:
    return min(100.0, max(0.0, value))


def _flag(value) -> bool | None:
    return None if value is None else value > 0


def _optional_int(value) -> int | None:
    return None if value is None else max(0, int(value))
