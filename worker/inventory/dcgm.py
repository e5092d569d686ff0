"""GPUs, MIG devices and metrics from dcgm-exporter's Prometheus text (contracts §10)."""

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import urllib3
from kubernetes import client

from fleet.cluster_access import metrics_url_refusal
from fleet.observations import GpuMetrics, GpuObservation, MigDeviceObservation
from fleet.services import gpu_health
from sharing.mig import get_product
from sharing.mig.catalog import UnknownProductError
from sharing.mig.placement import validate_layout
from worker.drivers.base import DriverError
from worker.drivers.kubernetes import api as k8s

log = logging.getLogger(__name__)

DCGM_PORT = 9400
_WANTED_METRICS = frozenset(
    {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    }
)
_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _int(value, default=0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass
class GpuSample:
    """One GPU as dcgm-exporter shows it, with its MIG devices (profile, GPU instance id, user)."""

    index: int
    uuid: str
    pci_bus_id: str = ""
    model: str = ""
    user: str = ""
    values: dict[str, float] = field(default_factory=dict)
    mig: list[tuple[str, int, str]] = field(default_factory=list)


def parse_dcgm(lines: Iterable[str]) -> dict[str, dict[int, GpuSample]]:
    """Prometheus text → Hostname → gpu index → sample. A lean parser for the few metrics and labels used:
    prometheus_client's parser costs 45–70 µs a sample here, about a minute for the ~950,000 samples of a
    10,000-node fleet; this one 2–4 µs (bench/README.md, B-sync). Label sets are parsed once, not per metric."""
    rows: dict[str, dict[str, float]] = {}
    for line in lines:
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace < 0 or line[:brace] not in _WANTED_METRICS:
            continue
        end = line.rfind("}")
        try:
            value = float(line[end + 1 :].split()[0])
        except (ValueError, IndexError):
            continue
        rows.setdefault(line[brace + 1 : end], {})[line[:brace]] = value
    nodes: dict[str, dict[int, GpuSample]] = {}
    for label_text, values in rows.items():
        labels = dict(_LABEL_RE.findall(label_text))
        host, uuid = labels.get("Hostname"), labels.get("UUID")
        index = _int(labels.get("gpu"), -1)
        if not host or not uuid or index < 0:
            continue
        gpu = nodes.setdefault(host, {}).get(index)
        if gpu is None or gpu.uuid != uuid:
            gpu = nodes[host][index] = GpuSample(index, uuid)
        user = f"{labels['namespace']}/{labels['pod']}" if labels.get("namespace") and labels.get("pod") else ""
        if labels.get("GPU_I_PROFILE"):
            gpu.mig.append((labels["GPU_I_PROFILE"], _int(labels.get("GPU_I_ID"), -1), user))
        else:
            gpu.pci_bus_id, gpu.model, gpu.user = labels.get("pci_bus_id", ""), labels.get("modelName", ""), user
            gpu.values = values
    return nodes


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    rest = b""
    for chunk in chunks:
        data = rest + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        rest = data[cut + 1 :]
        yield from data[:cut].decode("utf-8", "replace").split("\n")
    if rest:
        yield rest.decode("utf-8", "replace")


def fetch_metrics(cluster, node_names: Iterable[str] = ()) -> dict[str, dict[int, GpuSample]]:
    """Scrape dcgm-exporter: `cluster.metrics_url` (one endpoint for the fleet), else each node through the API's
    node proxy to the exporter's port (`/api/v1/nodes/<node>:9400/proxy/metrics`)."""
    api = k8s.api_client(cluster)
    if cluster.metrics_url:
        refusal = metrics_url_refusal(cluster.metrics_url)  # checked at save; settings may have changed since
        if refusal:
            raise DriverError(f"metrics URL refused: {refusal}")
        # The API client's pool carries the kubeconfig's CA, but never its credentials: /metrics is not the API.
        # No redirects: an allowed host must not send the worker on to one that is not.
        response = api.rest_client.pool_manager.request(
            "GET",
            cluster.metrics_url,
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=120),
            redirect=False,
        )
        try:
            if response.status != 200:
                raise DriverError(f"metrics endpoint answered {response.status}", transient=True)
            return parse_dcgm(_lines(response.stream(1 << 20)))
        finally:
            response.release_conn()
    core = client.CoreV1Api(api)

    def scrape(name):
        return parse_dcgm(_lines([k8s.call(core.connect_get_node_proxy_with_path, f"{name}:{DCGM_PORT}", "metrics")]))

    merged: dict[str, dict[int, GpuSample]] = {}
    for name, nodes, error in k8s.parallel(scrape, list(node_names)):
        if error is None:
            merged.update(nodes)
        else:
            log.info("no metrics from %s: %s", name, k8s.error_text(error))
    return merged


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


def mig_devices(product, rows: list[tuple[str, int, str]]) -> tuple[MigDeviceObservation, ...]:
    """MIG devices with placements. dcgm-exporter names profile and GPU-instance id but no placement: the start
    is derived from the id when that gives allowed, non-overlapping starts; otherwise deterministically from the
    catalog's placement of the same profile counts (larger first, lowest start). MIG UUIDs are not exported."""
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


def gpu_observations(product_label: str, samples: dict[int, GpuSample]) -> tuple[GpuObservation, ...]:
    """GPUs of one node from its exporter samples; the product from the node's GFD label (catalog for memory)."""
    gpus = []
    for index in sorted(samples):
        sample = samples[index]
        product = _product(product_label, sample.model)
        values = sample.values
        memory = (
            product.memory_mib
            if product
            else _int(values.get("DCGM_FI_DEV_FB_USED", 0)) + _int(values.get("DCGM_FI_DEV_FB_FREE", 0))
        )
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
                mig_enabled=bool(sample.mig),
                health=gpu_health(
                    last_xid=_int(values.get("DCGM_FI_DEV_XID_ERRORS")) or None,
                    ecc_dbe_total=_int(values.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
                )
                if values
                else "unknown",
                mig_devices=mig_devices(product, sample.mig) if product and product.mig_capable else (),
            )
        )
    return tuple(gpus)


def gpu_metrics(scraped: dict[str, dict[int, GpuSample]]) -> list[GpuMetrics]:
    samples = []
    for gpus in scraped.values():
        for sample in gpus.values():
            values = sample.values
            if not values:
                continue
            util = values.get("DCGM_FI_DEV_GPU_UTIL")
            samples.append(
                GpuMetrics(
                    uuid=sample.uuid,
                    utilization_pct=None if util is None else min(100.0, max(0.0, util)),
                    memory_used_mib=_optional_int(values.get("DCGM_FI_DEV_FB_USED")),
                    temperature_c=values.get("DCGM_FI_DEV_GPU_TEMP"),
                    power_w=values.get("DCGM_FI_DEV_POWER_USAGE"),
                    last_xid=_optional_int(values.get("DCGM_FI_DEV_XID_ERRORS")),
                    ecc_dbe_total=_optional_int(values.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
                    ecc_sbe_total=_optional_int(values.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")),
                )
            )
    return samples


def _optional_int(value) -> int | None:
    return None if value is None else max(0, int(value))
