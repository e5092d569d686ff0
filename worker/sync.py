"""Inventory from Kubernetes: nodes (list + watch), GPUs and MIG devices (dcgm-exporter), GPU pods, cluster health.

Nodes come from the API's Node objects and GPU Feature Discovery labels (contracts §3.6); GFD publishes no GPU
UUIDs, so GPUs come from dcgm-exporter's Prometheus text (§10), joined on Hostname + gpu + UUID. Everything is
recorded through the fleet services (bulk, idempotent): a repeated sync writes nothing.

HTTP never runs inside a database transaction; the watch batches events (up to `BATCH_SECONDS`) so a burst of
changes costs one recording whose size is the number of changed nodes.
"""

import logging
import queue
import random
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import urllib3
from django.db import connections, transaction
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from fleet.models import Node
from fleet.observations import GpuMetrics, GpuObservation, MigDeviceObservation, NodeObservation, PodObservation
from fleet.services import (
    NODE_FIELDS,
    cluster_record_contact,
    cluster_record_policy,
    gpu_health,
    gpu_metrics_record,
    inventory_record,
    pods_record,
)
from sharing.mig import get_product
from sharing.mig.catalog import UnknownProductError
from sharing.mig.placement import validate_layout
from worker.drivers.base import DriverError
from worker.drivers.kubernetes import api as k8s
from worker.drivers.kubernetes.driver import candidate_pods
from worker.drivers.kubernetes.labels import (
    GPU_NODE_SELECTOR,
    MIG_CONFIG,
    MIG_STATE,
    MIG_STATES,
    PLUGIN_CONFIG,
    gpu_allocatable,
    holds_gpu,
    node_labels,
    node_ready,
    pod_gpu_resources,
)
from worker.drivers.kubernetes.operator import HealthReport, Operator

log = logging.getLogger(__name__)

BATCH_SECONDS = 0.5
WATCH_SECONDS = 300  # server-side timeout of one watch request; the watcher resumes from the last version
HEALTH_EVERY_SECONDS = 300
CONTACT_EVERY_SECONDS = 10
BACKOFF_START, BACKOFF_CAP = 0.5, 30.0
DCGM_PORT = 9400
# Labels that change on every GFD pass without meaning anything: storing them would rewrite every node each time.
VOLATILE_LABELS = ("nvidia.com/gfd.timestamp",)


# --- nodes ----------------------------------------------------------------------------------------------------------


def _int(value, default=0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def observed_mode(labels: dict, allocatable: dict) -> str:
    """MIG when the node shows MIG devices (mixed: mig-* labels/resources; single: -MIG- product), else the
    device plugin's sharing strategy (contracts §3.6)."""
    mig = "-MIG-" in labels.get("nvidia.com/gpu.product", "") or any(
        key.startswith("nvidia.com/mig-") and key.endswith(".count") and _int(value) > 0
        for key, value in labels.items()
    )
    if mig or any(key.startswith("nvidia.com/mig-") and count for key, count in allocatable.items()):
        return "mig"
    strategy = labels.get("nvidia.com/gpu.sharing-strategy", "none")
    return {"mps": "mps", "time-slicing": "time_slicing"}.get(strategy, "passthrough")


def config_state(labels: dict, allocatable: dict, ready: bool | None) -> str:
    """`nvidia.com/mig.config.state` where MIG Manager runs. Nodes without it (no MIG-capable GPU) have only the
    device plugin to judge by: success while it advertises GPUs, failed when a selected config left it advertising
    none (§3.4 crash), unknown otherwise. Without this the loop would see such nodes as never in sync."""
    state = labels.get(MIG_STATE)
    if state in MIG_STATES:
        return state
    if labels.get("nvidia.com/mig.capable") == "true" or ready is False:
        return "unknown"
    if any(allocatable.values()):
        return "success"
    return "failed" if labels.get(PLUGIN_CONFIG) else "unknown"


def node_error(labels: dict, allocatable: dict, ready: bool | None, warning: str) -> str:
    """What is wrong with the node's sharing config, if anything (the latest Warning event explains it)."""
    if labels.get(MIG_STATE) == "failed":
        text = f"MIG Manager failed to apply {labels.get(MIG_CONFIG, '')!r}"
        return text + (f": {warning}" if warning else "")
    plugin_up = labels.get("nvidia.com/gpu.deploy.device-plugin", "true") == "true"
    if ready and plugin_up and not any(allocatable.values()) and warning:
        return warning
    return ""


def node_observation(node: dict, *, gpus=None, warning: str = "") -> NodeObservation:
    """A Node object (raw JSON) as the fleet's observation; `gpus` None leaves the node's GPUs as they are."""
    labels = {k: v for k, v in node_labels(node).items() if k not in VOLATILE_LABELS}
    allocatable = gpu_allocatable(node)
    ready = node_ready(node)
    info = (node.get("status") or {}).get("nodeInfo") or {}
    driver = labels.get("nvidia.com/cuda.driver-version.full") or ".".join(
        labels[k]
        for k in ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
                  "nvidia.com/cuda.driver-version.revision")
        if k in labels
    )  # fmt: skip
    cuda = labels.get("nvidia.com/cuda.runtime-version.full") or ".".join(
        labels[k] for k in ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor")
        if k in labels
    )  # fmt: skip
    return NodeObservation(
        name=node["metadata"]["name"],
        labels=labels,
        ready=ready,
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        allocatable=allocatable,
        kubelet_version=info.get("kubeletVersion", ""),
        driver_version=driver,
        cuda_version=cuda,
        observed_mode=observed_mode(labels, allocatable),
        observed_mig_config=labels.get(MIG_CONFIG, ""),
        observed_device_plugin_config=labels.get(PLUGIN_CONFIG, ""),
        config_state=config_state(labels, allocatable, ready),
        last_error=node_error(labels, allocatable, ready, warning)[:2000],
        gpus=gpus,
    )


def list_gpu_nodes(core: client.CoreV1Api) -> tuple[list[dict], str]:
    """Every GPU node (label nvidia.com/gpu.present=true), paginated; and the resourceVersion to watch from."""
    return k8s.list_all(core.list_node, label_selector=GPU_NODE_SELECTOR, limit=500)


def warnings_by_node(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    """The latest Warning event per node in the operator's namespace (e.g. the config-manager's crash, §3.4)."""
    try:
        events, _ = k8s.list_all(core.list_namespaced_event, namespace, field_selector="type=Warning", limit=1000)
    except Exception as exc:  # a nicety: the inventory is right without it
        log.info("warning events unavailable: %s", k8s.error_text(exc))
        return {}
    latest: dict[str, tuple[str, str]] = {}
    for event in events:
        host = (event.get("source") or {}).get("host") or event.get("reportingInstance") or ""
        at = event.get("lastTimestamp") or event.get("eventTime") or ""
        if host and at >= latest.get(host, ("", ""))[0]:
            latest[host] = (at, str(event.get("message", "")))
    return {host: message for host, (_, message) in latest.items()}


# --- dcgm-exporter metrics --------------------------------------------------------------------------------------------

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
        # The API client's pool carries the kubeconfig's CA, but never its credentials: /metrics is not the API.
        response = api.rest_client.pool_manager.request(
            "GET", cluster.metrics_url, preload_content=False, timeout=urllib3.Timeout(connect=5, read=120)
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


# --- syncs ------------------------------------------------------------------------------------------------------------


@dataclass
class SyncResult:
    """What a sync saw and changed."""

    resource_version: str = ""
    nodes: int = 0
    gpus: int = 0
    changed: object = None
    metrics_recorded: int = 0
    warnings: dict = field(default_factory=dict)


def sync_cluster_full(cluster, *, gpus: bool = True, metrics: bool = True, record_contact: bool = True) -> SyncResult:
    """List every GPU node and record them all (nodes not listed are marked gone). With `gpus`, dcgm-exporter is
    scraped for the GPUs and MIG devices; with `metrics` too, their utilisation and health are recorded."""
    core = client.CoreV1Api(k8s.api_client(cluster))
    nodes, version = list_gpu_nodes(core)
    warnings = warnings_by_node(core, cluster.operator_namespace)
    scraped = {}
    if gpus:
        try:
            scraped = fetch_metrics(cluster, [n["metadata"]["name"] for n in nodes if node_ready(n)])
        except Exception as exc:  # nodes still sync; GPUs wait for the next scrape
            log.warning("metrics scrape of %s failed: %s", cluster.name, k8s.error_text(exc))
    observations = []
    for node in nodes:
        name = node["metadata"]["name"]
        samples = scraped.get(name)
        found = gpu_observations(node_labels(node).get("nvidia.com/gpu.product", ""), samples) if samples else None
        observations.append(node_observation(node, gpus=found, warning=warnings.get(name, "")))
    changed = inventory_record(cluster=cluster, nodes=observations, complete=True)
    recorded = gpu_metrics_record(samples=gpu_metrics(scraped)) if scraped and metrics else 0
    if record_contact:
        cluster_record_contact(cluster)
    return SyncResult(version, len(nodes), sum(len(g) for g in scraped.values()), changed, recorded, warnings)


def scrape_metrics(cluster) -> SyncResult:
    """GPUs, MIG devices and their latest metrics from dcgm-exporter, for the cluster's live nodes as stored.

    Node fields are re-read under a row lock in the same transaction as the recording, so a watch event landing
    meanwhile is never overwritten by an older copy."""
    live = list(Node.objects.live().filter(cluster=cluster, ready=True).values_list("name", flat=True))
    scraped = fetch_metrics(cluster, live) if (live or cluster.metrics_url) else {}
    live_names = set(live)
    names = [name for name in scraped if name in live_names]
    with transaction.atomic():
        rows = []
        for i in range(0, len(names), 900):
            rows += Node.objects.select_for_update().filter(cluster=cluster, name__in=names[i : i + 900])
        observations = [
            NodeObservation(
                name=row.name,
                **{f: getattr(row, f) for f in NODE_FIELDS},
                gpus=gpu_observations(row.labels.get("nvidia.com/gpu.product", ""), scraped[row.name]),
            )
            for row in rows
        ]
        changed = inventory_record(cluster=cluster, nodes=observations)
    recorded = gpu_metrics_record(samples=gpu_metrics(scraped))
    return SyncResult("", len(rows), sum(len(g) for g in scraped.values()), changed, recorded)


def _resource_requirements(resources: dict | None) -> dict:
    resources = resources or {}
    return {"requests": resources.get("requests") or {}, "limits": resources.get("limits") or {}}


def _container_resources(container: dict) -> dict:
    """A container as Kubernetes shapes it, cut to what the QoS rules read (sharing.qos.qos_class)."""
    return {"name": container.get("name", ""), "resources": _resource_requirements(container.get("resources"))}


def pod_observation(pod: dict) -> PodObservation:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)
    owner = owner or next(iter(meta.get("ownerReferences") or []), {})
    kept = {
        kind: [_container_resources(c) for c in spec.get(kind) or []]
        for kind in ("containers", "initContainers")
        if spec.get(kind)
    }
    if spec.get("resources"):  # pod-level resources decide the QoS class when set (Kubernetes 1.32+)
        kept["resources"] = _resource_requirements(spec["resources"])
    return PodObservation(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid") or f"{meta['namespace']}/{meta['name']}",
        phase=status.get("phase", ""),
        qos_class=status.get("qosClass", ""),
        priority_class=spec.get("priorityClassName", ""),
        owner_kind=owner.get("kind", ""),
        owner_name=owner.get("name", ""),
        gpu_resources=pod_gpu_resources(pod),
        spec={**kept, "tolerations": spec.get("tolerations") or []},
    )


def sync_pods(cluster) -> int:
    """Every live GPU-holding pod per node (cluster-wide lists, see candidate_pods); pods gone since are removed."""
    core = client.CoreV1Api(k8s.api_client(cluster))
    pods = candidate_pods(core, cluster.operator_namespace)
    by_node = {name: [] for name in Node.objects.live().filter(cluster=cluster).values_list("name", flat=True)}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in by_node and holds_gpu(pod, cluster.operator_namespace):
            by_node[node].append(pod_observation(pod))
    return pods_record(cluster=cluster, pods_by_node=by_node)


def cluster_health(cluster, *, record: bool = True) -> HealthReport:
    """API reachable, ClusterPolicy found, MIG and device-plugin ConfigMaps managed by Tessera; the first problem
    is stored on the cluster (connection state error + last_error) so the UI says it plainly. The policy's MIG
    strategy and the device plugin's version are stored whenever the policy was read."""
    try:
        report = Operator(k8s.api_client(cluster), cluster.operator_namespace, cluster.name).health()
    except DriverError as exc:
        report = HealthReport()
        report.add("credentials", False, str(exc))
    except Exception as exc:
        report = HealthReport()
        report.add("api_reachable", False, f"{cluster.name}: {k8s.error_text(exc)}")
    if report.policy is not None:
        cluster_record_policy(
            cluster, mig_strategy=report.policy.mig_strategy, device_plugin_version=report.device_plugin_version
        )
    if record:
        cluster_record_contact(cluster, report.problem, reached=report.reachable)
    return report


# --- watching ---------------------------------------------------------------------------------------------------------


class _RawWatch(watch.Watch):
    """Events as the JSON dicts of the wire (no model deserialisation); resource versions tracked by the caller."""

    def get_return_type(self, func):
        return None


_END = object()


class _StreamFailed(Exception):
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error
        self.progressed = False


@dataclass
class WatchStats:
    """Counters for tests, benchmarks and logs."""

    lists: int = 0
    streams: int = 0
    events: int = 0
    batches: int = 0
    errors: int = 0
    disconnects: int = 0
    gone: int = 0
    last_batch_nodes: int = 0
    resource_version: str = ""


class ClusterWatcher:
    """List, then watch a cluster's GPU nodes from the list's resourceVersion; resume from the last version seen
    when a stream ends or is cut, re-list on 410 Gone, back off (capped, jittered) on errors. Records connection
    health: reachable or the error, and the health check's problem (re-checked every few minutes)."""

    def __init__(self, cluster, stop_event: threading.Event | None = None, *, gpus_on_start: bool = True,
                 batch_seconds: float = BATCH_SECONDS, watch_seconds: int = WATCH_SECONDS,
                 on_batch=None):  # fmt: skip
        self.cluster = cluster
        self.stop_event = stop_event or threading.Event()
        self.gpus_on_start = gpus_on_start
        self.batch_seconds = batch_seconds
        self.watch_seconds = watch_seconds
        self.on_batch = on_batch
        self.stats = WatchStats()
        self.version: str | None = None  # where the next watch starts; None: list first
        self._watch: _RawWatch | None = None
        self._warnings: dict[str, str] = {}
        self._health_problem: str | None = None
        self._health_at = 0.0
        self._recorded: object = object()
        self._recorded_at = 0.0
        self._seen: str | None = None  # the newest version seen on the stream (recorded or pending)

    def stop(self) -> None:
        self.stop_event.set()
        current = self._watch
        if current is not None:
            current.stop()  # shuts the socket down: the reader thread wakes at once

    def run(self) -> None:
        backoff, first = BACKOFF_START, True
        try:
            while not self.stop_event.is_set():
                try:
                    if self.version is None:
                        self._list(gpus=first and self.gpus_on_start)
                        first = False
                    self._stream()
                    backoff = BACKOFF_START
                except _Relist:
                    self.version = None
                except Exception as exc:
                    error = exc.error if isinstance(exc, _StreamFailed) else exc
                    if isinstance(error, ApiException) and error.status == 410:
                        self.stats.gone += 1
                        log.info("watch of %s: resource version too old, listing again", self.cluster.name)
                        self.version = None
                        continue
                    if isinstance(exc, _StreamFailed) and exc.progressed and _is_cut(error):
                        self.stats.disconnects += 1  # a cut stream that delivered events: resume at once
                        continue
                    self.stats.errors += 1
                    text = f"{self.cluster.name}: {k8s.error_text(error)}"
                    log.warning("watch of %s failed (retrying in %.1f s): %s", self.cluster.name, backoff, text)
                    self._record(text, reached=False)
                    self.stop_event.wait(backoff * random.uniform(0.5, 1.0))
                    backoff = min(BACKOFF_CAP, backoff * 2)
        finally:
            connections.close_all()  # this thread's connections: a watcher thread ends for good

    def _list(self, *, gpus: bool) -> None:
        # Utilisation is left to the periodic scrape (worker.tasks.cluster_scrape_metrics): the watch starts sooner.
        result = sync_cluster_full(self.cluster, gpus=gpus, metrics=False, record_contact=False)
        self._warnings = result.warnings
        self.stats.lists += 1
        self.version = self.stats.resource_version = result.resource_version
        self._check_health(force=True)

    def _check_health(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._health_at > HEALTH_EVERY_SECONDS:
            self._health_at = now
            self._health_problem = cluster_health(self.cluster, record=False).problem
        self._record(None, reached=True)

    def _record(self, error: str | None, *, reached: bool) -> None:
        """Write the cluster's connection state when it changes, and the contact time at most every few seconds."""
        problem = error if error is not None else self._health_problem
        now = time.monotonic()
        if problem == self._recorded and now - self._recorded_at < CONTACT_EVERY_SECONDS:
            return
        self._recorded, self._recorded_at = problem, now
        cluster_record_contact(self.cluster, problem, reached=reached)

    def _stream(self) -> None:
        """One watch request from `self.version`, until the server ends it; events are recorded in batches."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        stream_watch = self._watch = _RawWatch()
        core = client.CoreV1Api(k8s.api_client(self.cluster))
        started_at = self._seen = self.version

        def read():
            try:
                for event in stream_watch.stream(
                    core.list_node,
                    label_selector=GPU_NODE_SELECTOR,
                    resource_version=started_at,
                    timeout_seconds=self.watch_seconds,
                    allow_watch_bookmarks=True,
                    _request_timeout=(10, self.watch_seconds + 30),
                ):
                    events.put(event)
                events.put(_END)
            except BaseException as exc:  # handed to the loop, which decides: resume, re-list or back off
                events.put(_StreamFailed(exc))

        reader = threading.Thread(target=read, name=f"watch-{self.cluster.pk}", daemon=True)
        reader.start()
        self.stats.streams += 1
        pending: dict[str, dict] = {}
        first_at = None
        try:
            while True:
                wait = 1.0 if first_at is None else max(0.0, first_at + self.batch_seconds - time.monotonic())
                try:
                    item = events.get(timeout=wait)
                except queue.Empty:
                    item = None
                if self.stop_event.is_set():
                    self._flush(pending)
                    return
                if item is None:
                    if pending and time.monotonic() - first_at >= self.batch_seconds:
                        self._flush(pending)
                        first_at = None
                    self._check_health()
                    continue
                if item is _END:
                    self._flush(pending)
                    return
                if isinstance(item, _StreamFailed):
                    self._flush(pending)
                    item.progressed = self.version != started_at
                    raise item
                kind, obj = item.get("type"), item.get("raw_object") or item.get("object") or {}
                meta = obj.get("metadata") or {}
                if kind == "DELETED":
                    # Gone nodes are marked by a complete listing, the one place that knows what is absent.
                    self._flush(pending)
                    raise _Relist()
                if kind in ("ADDED", "MODIFIED"):
                    pending[meta["name"]] = obj
                    self.stats.events += 1
                    first_at = first_at or time.monotonic()
                # Recorded events and bookmarks both move the resume point (after the flush that records them).
                if time.monotonic() - (first_at or 0) >= self.batch_seconds:
                    self._flush(pending)
                    first_at = None
                self._advance(meta.get("resourceVersion"), pending)
        finally:
            stream_watch.stop()
            self._watch = None

    def _advance(self, version: str | None, pending: dict) -> None:
        """Resume from `version` only once nothing older is left unrecorded (a cut stream then loses nothing)."""
        if not version:
            return
        self._seen = version
        if not pending:
            self.version = self.stats.resource_version = version

    def _flush(self, pending: dict[str, dict]) -> None:
        if not pending:
            return
        observations = [node_observation(obj, warning=self._warnings.get(name, "")) for name, obj in pending.items()]
        inventory_record(cluster=self.cluster, nodes=observations)
        self.stats.batches += 1
        self.stats.last_batch_nodes = len(observations)
        pending.clear()
        if self._seen:
            self.version = self.stats.resource_version = self._seen
        self._record(None, reached=True)
        if self.on_batch is not None:
            self.on_batch(self.stats)


def _is_cut(error: BaseException) -> bool:
    """The connection broke mid-stream (a load balancer, an API server restart): resume, it is not a failure."""
    return isinstance(error, urllib3.exceptions.ProtocolError | urllib3.exceptions.ReadTimeoutError | ConnectionError)


class _Relist(Exception):
    """Start over with a complete listing (a node left the cluster)."""


def watch_cluster(cluster, stop_event: threading.Event, **options) -> WatchStats:
    """Watch one cluster until `stop_event` is set (the body of a `watch_clusters` thread)."""
    watcher = ClusterWatcher(cluster, stop_event, **options)
    watcher.run()
    return watcher.stats
