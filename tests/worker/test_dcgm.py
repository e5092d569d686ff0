"""dcgm-exporter as Tessera reads it on a real cluster, against the simulator over HTTPS with the official client
(contracts §10, §11): each node's exporter pod through the pod proxy, a Prometheus server's query API, health from
XIDs as the device plugin classifies them and from row remapping, and the utilisation and memory of MIG slices."""

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from django.forms.models import model_to_dict
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from fleet.models import Cluster, Gpu, MigDevice
from simulator.resources import PODS, SERVICES
from tests.factories import ClusterFactory, UserFactory
from tests.processes import wait_until
from worker.drivers.base import DriverError
from worker.inventory.cluster import scrape_metrics, sync_cluster_full
from worker.inventory.exporters import fetch_metrics

H100_BALANCED, H100_IDLE, T4 = "gpu-node-0010", "gpu-node-0002", "gpu-node-0003"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"


@pytest.fixture
def sim_options():
    return {"workload_pods": 6}


def _set_metrics(cluster, **values):
    Cluster.objects.filter(pk=cluster.pk).update(**values)
    cluster.refresh_from_db()
    return cluster


@pytest.fixture
def pod_proxy_cluster(sim_cluster):
    """The cluster as a stock GPU Operator leaves it: no metrics endpoint, so each exporter pod is scraped."""
    return _set_metrics(sim_cluster, metrics_url="")


def gpu_page(client, viewer, gpu) -> str:
    client.force_login(viewer)
    response = client.get(reverse("console:gpu_detail", args=[gpu.pk]))
    assert response.status_code == 200
    return response.content.decode()


# --- where the exporter is read -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_node_is_read_from_its_exporter_pod_through_the_pod_proxy(sim, pod_proxy_cluster):
    scraped = fetch_metrics(pod_proxy_cluster, [H100_BALANCED, T4, "gpu-node-9999"])
    assert len(scraped[H100_BALANCED]) == 8 and len(scraped[T4]) == 4
    assert "gpu-node-9999" not in scraped  # a node without an exporter pod is left out, not fatal
    result = sync_cluster_full(pod_proxy_cluster)
    assert result.gpus == Gpu.objects.count() == sum(len(n.gpus) for n in sim.nodes.values() if n.ready)


@pytest.mark.django_db
def test_an_exporter_paused_for_a_mig_change_leaves_only_its_node_out(sim, core, pod_proxy_cluster):
    sim.faults.update({"wedge": {H100_IDLE: 1}})  # the MIG Manager pauses the exporter and never resumes it
    core.patch_node(
        H100_IDLE,
        {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}},
        _content_type="application/merge-patch+json",
    )
    assert sim.settle()
    scraped = fetch_metrics(pod_proxy_cluster, [H100_IDLE, T4])
    assert list(scraped) == [T4]


@pytest.mark.django_db
def test_exporter_pods_without_the_operators_label_are_found_by_their_service(sim, pod_proxy_cluster):
    """A standalone install of dcgm-exporter's own chart labels its pods otherwise; its Service still selects them."""
    chart_labels = {"app.kubernetes.io/name": "dcgm-exporter", "app.kubernetes.io/instance": "dcgm-exporter"}
    for pod in sim.store.objects(PODS):
        if pod["metadata"]["labels"].get("app") == "nvidia-dcgm-exporter":
            sim.store.mutate(
                PODS, "gpu-operator", pod["metadata"]["name"], lambda o: o["metadata"].update(labels=dict(chart_labels))
            )
    service = {
        "metadata": {"name": "dcgm-exporter", "namespace": "gpu-operator"},
        "spec": {"selector": chart_labels, "ports": [{"name": "metrics", "port": 9400, "targetPort": 9400}]},
    }
    sim.store.create(SERVICES, service)
    scraped = fetch_metrics(pod_proxy_cluster, [H100_BALANCED, T4])
    assert set(scraped) == {H100_BALANCED, T4}


@pytest.mark.django_db
def test_older_exporters_name_the_host_Hostname(sim, sim_cluster):
    sim.config.dcgm_host_label = "Hostname"  # every release before the rename (contracts §10)
    scraped = fetch_metrics(sim_cluster)  # the central endpoint: rows are told apart by their host label
    assert len(scraped[H100_BALANCED]) == 8 and len(scraped[T4]) == 4


# --- health ---------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_xids_are_classified_as_the_device_plugin_does(sim, sim_cluster, client, viewer):
    sync_cluster_full(sim_cluster, gpus=False)
    sim.faults.update({"xid": {H100_IDLE: {"3": 79, "2": 13, "1": 43, "0": 63}}})
    scrape_metrics(sim_cluster)
    gpus = {g.index: g for g in Gpu.objects.filter(node__name=H100_IDLE)}
    assert {i: gpus[i].health for i in range(5)} == {
        0: "unhealthy",  # row remap recorded: not an application error
        1: "healthy",  # 43: an application error, the device plugin keeps the GPU
        2: "healthy",  # 13: likewise
        3: "unhealthy",
        4: "healthy",
    }
    assert gpus[3].health_words.startswith("XID 79: fallen off the bus")
    assert gpus[0].health_words == "XID 63: row remap pending: reset the GPU once drained"
    assert "application error" in gpus[2].health_words and gpus[4].health_words == ""
    # What the default counters carry, and what the page says is missing.
    assert set(gpus[4].health_signals) == {
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    }
    html = gpu_page(client, viewer, gpus[3])
    assert "fallen off the bus" in html and "3 health signals this cluster" in html
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors." in html
    assert f"{REMAP_PENDING}, gauge, Whether remapping of rows is pending" in html


@pytest.mark.django_db
def test_row_remapping_pending_and_failed(sim, sim_cluster, client, viewer):
    sim.dcgm_counters = sim.dcgm_counters | {REMAP_PENDING}  # a custom counters CSV adds the pending flag
    gpu = sim.nodes[H100_IDLE].gpus[5]
    gpu.remap_pending, gpu.remapped_uncorrectable = True, 1
    sync_cluster_full(sim_cluster)
    stored = Gpu.objects.get(uuid=gpu.uuid)
    assert (stored.health, stored.row_remap_pending, stored.uncorrectable_remapped_rows) == ("degraded", True, 1)
    assert stored.health_words == "row remap pending: reset the GPU once drained"
    html = gpu_page(client, viewer, stored)
    assert "remap pending a reset" in html and f"<code>{REMAP_PENDING}</code>" not in html
    gpu.remap_failure = True
    scrape_metrics(sim_cluster)
    stored.refresh_from_db()
    assert (stored.health, stored.health_words) == ("unhealthy", "row remapping failed: replace the GPU")


# --- MIG slices -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_mig_slices_have_utilisation_and_memory_and_the_gpu_their_aggregate(sim, sim_cluster, client, viewer):
    sync_cluster_full(sim_cluster)
    gpu = Gpu.objects.get(uuid=sim.nodes[H100_BALANCED].gpus[0].uuid)
    slices = list(MigDevice.objects.filter(gpu=gpu).order_by("start"))
    assert len(slices) == 4 and all(s.utilization_pct is not None and s.memory_used_mib for s in slices)
    assert gpu.memory_used_mib == sum(s.memory_used_mib for s in slices)
    weighted = sum(s.utilization_pct * s.size for s in slices) / sum(s.size for s in slices)
    assert gpu.utilization_pct == pytest.approx(weighted, abs=0.06)
    # Busy slices are the ones pods hold, as the exporter's pod mapping says.
    busy = MigDevice.objects.filter(gpu__node__name=H100_BALANCED).exclude(in_use_by="")
    assert all(d.utilization_pct >= 50 for d in busy)
    # No remapped rows can be read while MIG is on: the page says why instead of offering CSV lines.
    assert gpu.health_signals == ["DCGM_FI_DEV_XID_ERRORS"]
    html = gpu_page(client, viewer, gpu)
    assert "NVML cannot read remapped rows while MIG is enabled" in html
    assert html.count('class="mig-util mig-ink-') == 4 and "mean of its slices" not in html
    client.force_login(viewer)
    node_page = client.get(reverse("console:node_detail", args=[gpu.node_id])).content.decode()
    assert "mean of its slices" in node_page and node_page.count('class="mig-util mig-ink-') == 8 * 4


@pytest.mark.django_db
def test_the_api_shows_slices_and_gpus_alike(sim, sim_cluster, viewer_api):
    sync_cluster_full(sim_cluster)
    gpu = Gpu.objects.get(uuid=sim.nodes[H100_BALANCED].gpus[1].uuid)
    detail = viewer_api.get(f"/api/v1/gpus/{gpu.pk}/").data
    assert detail["utilization_pct"] is not None and detail["memory_used_mib"] > 0
    assert all(d["utilization_pct"] is not None and d["memory_used_mib"] is not None for d in detail["mig_devices"])
    assert detail["health_signals"] == ["DCGM_FI_DEV_XID_ERRORS"] and detail["health_detail"] == ""
    listed = viewer_api.get("/api/v1/mig-devices/", {"gpu": gpu.pk}).data["results"]
    assert {d["memory_used_mib"] for d in listed} == {d["memory_used_mib"] for d in detail["mig_devices"]}


# --- Prometheus -----------------------------------------------------------------------------------------------------


class _PrometheusStandIn(BaseHTTPRequestHandler):
    """Prometheus' `GET /api/v1/query` over the simulator's exporters, scraped as a ServiceMonitor with the operator's
    honorLabels=false does: the exporter's pod/namespace/container become exported_*, the target's labels are added."""

    sim = None
    queries: list = []

    def do_GET(self):  # noqa: N802 — the name http.server calls
        url = urlsplit(self.path)
        query = parse_qs(url.query).get("query", [""])[0]
        type(self).queries.append(query)
        if url.path != "/api/v1/query" or not query.startswith('{__name__=~"'):
            self._answer(400, {"status": "error", "errorType": "bad_data", "error": "parse error"})
            return
        names = set(query.removeprefix('{__name__=~"').removesuffix('"}').split("|"))
        result = []
        for family in text_string_to_metric_families(self.sim.metrics_text()):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")  # prometheus_client's suffix on counters
                if name not in names:
                    continue
                labels = {
                    (f"exported_{k}" if k in ("namespace", "pod", "container") else k): v
                    for k, v in sample.labels.items()
                }
                host = labels["hostname"]
                labels.update(
                    __name__=name,
                    namespace="gpu-operator",
                    pod=f"nvidia-dcgm-exporter-{host}",
                    container="nvidia-dcgm-exporter",
                    service="nvidia-dcgm-exporter",
                    endpoint="gpu-metrics",
                    job="nvidia-dcgm-exporter",
                    instance=f"{host}:9400",
                )
                result.append({"metric": labels, "value": [time.time(), repr(sample.value)]})
        self._answer(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

    def _answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus_stand_in(sim):
    handler = type("Handler", (_PrometheusStandIn,), {"sim": sim, "queries": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.mark.django_db
def test_metrics_from_the_clusters_prometheus(sim, sim_cluster, prometheus_stand_in):
    url, handler = prometheus_stand_in
    cluster = _set_metrics(sim_cluster, metrics_url="", prometheus_url=url + "/")
    result = sync_cluster_full(cluster)
    assert result.gpus == Gpu.objects.count() == sum(len(n.gpus) for n in sim.nodes.values() if n.ready)
    assert handler.queries and "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in handler.queries[0]
    # Users come from the renamed workload labels, never from the target's (the exporter pod's own).
    users = set(MigDevice.objects.exclude(in_use_by="").values_list("in_use_by", flat=True))
    workload = {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in sim.store.objects(PODS)}
    assert users and users <= workload
    assert not MigDevice.objects.filter(in_use_by__startswith="gpu-operator/").exists()
    assert MigDevice.objects.filter(gpu__node__name=H100_BALANCED, utilization_pct__isnull=False).count() == 8 * 4


@pytest.mark.django_db
def test_a_refused_query_is_an_error_with_prometheus_reason(sim, sim_cluster, prometheus_stand_in):
    url, _ = prometheus_stand_in
    cluster = _set_metrics(sim_cluster, metrics_url="", prometheus_url=url + "/not-prometheus")
    with pytest.raises(DriverError, match="Prometheus answered 400: bad_data parse error"):
        fetch_metrics(cluster)


def test_the_prometheus_url_must_be_http(admin_api, db):
    kubeconfig = str(Path(settings.TESSERA["KUBECONFIG_DIR"]) / "lab.kubeconfig")  # not there yet: accepted
    payload = {"name": "lab", "driver": "kubernetes", "kubeconfig_path": kubeconfig, "prometheus_url": "ftp://p:9090"}
    response = admin_api.post("/api/v1/clusters/", payload, format="json")
    assert response.status_code == 400 and "prometheus_url" in response.data["errors"]
    payload["prometheus_url"] = "http://prometheus.elsewhere.example:9090"  # not on TESSERA_METRICS_URL_ALLOW
    refused = admin_api.post("/api/v1/clusters/", payload, format="json")
    assert refused.status_code == 400 and "is not allowed for metrics" in refused.data["errors"]["prometheus_url"][0]
    payload["prometheus_url"] = "http://prometheus.monitoring.svc:9090"
    assert admin_api.post("/api/v1/clusters/", payload, format="json").status_code == 201


def test_the_admin_form_takes_a_prometheus_url_and_refuses_other_schemes(client, db):
    cluster = ClusterFactory(name="lab", kubeconfig_path=str(Path(settings.TESSERA["KUBECONFIG_DIR"]) / "lab.conf"))
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    change = reverse("admin:fleet_cluster_change", args=[cluster.pk])
    form = client.get(change).content.decode()
    assert 'name="prometheus_url"' in form
    data = {k: "" if v is None else v for k, v in model_to_dict(cluster).items() if k != "in_cluster"}
    refused = client.post(change, {**data, "prometheus_url": "ftp://prom:9090"})
    assert refused.status_code == 200 and "Enter a valid URL." in refused.content.decode()
    cluster.refresh_from_db()
    assert cluster.prometheus_url == ""
    assert client.post(change, {**data, "prometheus_url": "https://prom.monitoring.svc:9090"}).status_code == 302
    cluster.refresh_from_db()
    assert cluster.prometheus_url == "https://prom.monitoring.svc:9090"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
@pytest.mark.skipif(not shutil.which("prometheus"), reason="Debian's prometheus package is not installed")
def test_a_real_prometheus_scraping_the_exporter(sim, sim_cluster, tmp_path):
    """Prometheus scrapes the simulator's exporter endpoint; Tessera reads the series back with instant queries."""
    port = _free_port()
    host = sim.url.removeprefix("https://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: dcgm\n"
        "    scheme: https\n"
        f"    tls_config: {{ca_file: {sim.ca_path}}}\n"
        f"    static_configs: [{{targets: ['{host}']}}]\n"
    )
    process = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        def scraped():
            try:
                with urllib.request.urlopen(f"{url}/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP", timeout=2) as response:
                    return json.loads(response.read())["data"]["result"]
            except OSError:
                return None

        wait_until(scraped, timeout=60)
        cluster = _set_metrics(sim_cluster, metrics_url="", prometheus_url=url)
        result = sync_cluster_full(cluster)
        assert result.gpus == sum(len(n.gpus) for n in sim.nodes.values() if n.ready)
        assert MigDevice.objects.filter(gpu__node__name=H100_BALANCED, memory_used_mib__isnull=False).count() == 32
    finally:
        process.terminate()
        process.wait(timeout=30)
