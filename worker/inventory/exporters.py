"""Where dcgm-exporter is read from (contracts §10): the cluster's Prometheus, one central endpoint, or each node's
exporter pod through the API server's pod proxy.

The pod proxy is the default because it is the one path a stock GPU Operator leaves open: the exporter's
DaemonSet has no hostPort and no hostNetwork, so `nodes/<node>:9400/proxy` finds nothing listening on the node.
"""

import json
import logging
from collections.abc import Iterable, Iterator
from urllib.parse import urlencode

import urllib3
from kubernetes import client

from fleet.cluster_access import AccessRefused, checked_metrics_url
from worker.drivers.base import DriverError
from worker.drivers.kubernetes import api as k8s
from worker.inventory.dcgm import WANTED_METRICS, GpuSample, group_samples, parse_dcgm

log = logging.getLogger(__name__)

EXPORTER_APP = "nvidia-dcgm-exporter"  # the pod and Service label `app` the GPU Operator gives the exporter
DCGM_PORT = 9400
_TIMEOUT = urllib3.Timeout(connect=5, read=120)
# The exporter labels a row with the workload's pod; Prometheus keeps them as exported_* when its own target labels
# (the exporter pod's) take the names, as a ServiceMonitor with the operator's default honorLabels=false does.
_WORKLOAD_LABELS = ("namespace", "pod", "container")

Scraped = dict[str, dict[int, GpuSample]]


def fetch_metrics(cluster, node_names: Iterable[str] | None = None) -> Scraped:
    """dcgm-exporter's series for the cluster's nodes (all of them, or `node_names`): host → gpu index → sample.

    From `cluster.prometheus_url` (an instant query), else `cluster.metrics_url` (one endpoint for the fleet), else
    the exporter pod of each node through the pod proxy."""
    if cluster.prometheus_url:
        return query_prometheus(cluster)
    if cluster.metrics_url:
        return _read(cluster, cluster.metrics_url, lambda response: parse_dcgm(_lines(response.stream(1 << 20))))
    return scrape_exporter_pods(cluster, node_names)


def _read(cluster, url: str, parse, what: str = "metrics endpoint"):
    """GET `url` with the cluster's API client pool (it carries the kubeconfig's CA, never its credentials: these
    endpoints are not the API) and parse the streamed response; any status but 200 is a (transient) error."""
    try:  # checked at save; the allow-list may have changed since
        checked = checked_metrics_url(url)
    except AccessRefused as exc:
        raise DriverError(f"{what} refused: {exc}") from None
    pool = k8s.api_client(cluster).rest_client.pool_manager
    # Only the URL rebuilt from the checked parts is fetched, and no redirect: an allowed host must not send the
    # worker on to one that is not.
    response = pool.request("GET", checked, preload_content=False, timeout=_TIMEOUT, redirect=False)
    try:
        if response.status != 200:
            raise DriverError(f"{what} answered {response.status}{_error_text(response)}", transient=True)
        return parse(response)
    finally:
        response.release_conn()


def _error_text(response) -> str:
    """Prometheus' reason for refusing a query (`{"status": "error", "errorType", "error"}`), if it gave one."""
    try:
        body = json.loads(response.read(64 * 1024))
    except (ValueError, TypeError):
        return ""
    return f": {body.get('errorType', '')} {body.get('error', '')}".rstrip() if isinstance(body, dict) else ""


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


# --- the exporter pods, through the pod proxy -----------------------------------------------------------------------


def exporter_pods(core: client.CoreV1Api, namespace: str) -> dict[str, tuple[str, int]]:
    """Node → (pod, port) of each running dcgm-exporter pod in the operator's namespace: the pods labelled
    `app=nvidia-dcgm-exporter`, else those selected by a Service whose name says dcgm-exporter (a standalone
    install of the exporter's own chart)."""
    pods, _ = k8s.list_all(core.list_namespaced_pod, namespace, label_selector=f"app={EXPORTER_APP}")
    service_port = DCGM_PORT
    if not pods:
        services, _ = k8s.list_all(core.list_namespaced_service, namespace)
        for service in services:
            spec = service.get("spec") or {}
            if "dcgm-exporter" not in service["metadata"]["name"] or not spec.get("selector"):
                continue
            selector = ",".join(f"{k}={v}" for k, v in sorted(spec["selector"].items()))
            pods, _ = k8s.list_all(core.list_namespaced_pod, namespace, label_selector=selector)
            if pods:
                target = next(iter(spec.get("ports") or []), {}).get("targetPort", DCGM_PORT)
                service_port = target if isinstance(target, int) else DCGM_PORT
                break
    found = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") == "Running":
            found[node] = (pod["metadata"]["name"], _metrics_port(pod) or service_port)
    return found


def _metrics_port(pod: dict) -> int | None:
    """The container port named `metrics` (the operator's name for 9400), if the pod declares one."""
    for container in pod["spec"].get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "metrics" and port.get("containerPort"):
                return int(port["containerPort"])
    return None


def scrape_exporter_pods(cluster, node_names: Iterable[str] | None = None) -> Scraped:
    """Each node's exporter through `/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics`; its rows belong to
    the pod's node whatever their host label says. A node whose exporter cannot be read is left out, not fatal."""
    core = client.CoreV1Api(k8s.api_client(cluster))
    namespace = cluster.operator_namespace
    pods = exporter_pods(core, namespace)
    wanted = list(pods) if node_names is None else [n for n in node_names if n in pods]
    missing = [] if node_names is None else [n for n in node_names if n not in pods]
    if missing:
        log.info("no running dcgm-exporter pod in %s on %d node(s), e.g. %s", namespace, len(missing), missing[0])

    def scrape(node):
        pod, port = pods[node]
        body = k8s.call(core.connect_get_namespaced_pod_proxy_with_path, f"{pod}:{port}", namespace, "metrics")
        return parse_dcgm(_lines([body]), host=node)

    merged: Scraped = {}
    for node, nodes, error in k8s.parallel(scrape, wanted):
        if error is None:
            merged.update(nodes)
        else:
            log.info("no metrics from %s: %s", node, k8s.error_text(error))
    return merged


# --- Prometheus -----------------------------------------------------------------------------------------------------


def prometheus_query() -> str:
    """One instant query for every DCGM series Tessera reads."""
    return '{__name__=~"' + "|".join(sorted(WANTED_METRICS)) + '"}'


def query_prometheus(cluster) -> Scraped:
    """The DCGM series as the cluster's Prometheus last scraped them (`GET /api/v1/query`, an instant vector)."""
    url = f"{cluster.prometheus_url.rstrip('/')}/api/v1/query?{urlencode({'query': prometheus_query()})}"
    namespace = cluster.operator_namespace
    return _read(cluster, url, lambda r: prometheus_samples(json.loads(r.data), namespace), "Prometheus")


def prometheus_samples(body: dict, operator_namespace: str) -> Scraped:
    """A query answer (`{"status", "data": {"resultType": "vector", "result": [{metric, value}]}}`) as samples."""
    if body.get("status") != "success":
        raise DriverError(f"Prometheus refused the query: {body.get('errorType', '')} {body.get('error', '')}".strip())
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise DriverError(f"Prometheus answered a {data.get('resultType')!r}, not an instant vector")
    rows: dict[tuple, tuple[dict, dict[str, float]]] = {}
    for series in data.get("result") or []:
        labels = dict(series.get("metric") or {})
        name = labels.pop("__name__", "")
        try:
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if value != value:  # NaN: a stale or unsupported field
            continue
        labels = _workload_labels(labels, operator_namespace)
        rows.setdefault(tuple(sorted(labels.items())), (labels, {}))[1][name] = value
    return group_samples(rows.values())


def _workload_labels(labels: dict, operator_namespace: str) -> dict:
    """The exporter's own workload labels back under their names: exported_* when Prometheus renamed them; without
    them, a `namespace`/`pod` in the operator's namespace is the scrape target (the exporter pod), not a user."""
    if any(f"exported_{name}" in labels for name in _WORKLOAD_LABELS):
        for name in _WORKLOAD_LABELS:
            labels[name] = labels.pop(f"exported_{name}", "")
    elif labels.get("namespace") == operator_namespace:
        for name in _WORKLOAD_LABELS:
            labels.pop(name, None)
    return labels
