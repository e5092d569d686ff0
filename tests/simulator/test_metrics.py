"""dcgm-exporter metrics: parseable Prometheus text, one sample per GPU and MIG device, labels as in contracts §10."""

import ssl
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from simulator import metrics
from simulator.fleet import generate_node

GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def fetch(sim, path: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(sim.url + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=sim.ca_path)
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(text: str) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_metrics_cover_every_gpu_with_dcgm_labels(sim):
    status, text = fetch(sim, "/metrics")  # no token needed, like scraping dcgm-exporter directly
    assert status == 200
    families = samples(text)
    assert set(families) == {name for name, _, _ in metrics.METRICS}
    whole_gpu_rows = families["DCGM_FI_DEV_GPU_TEMP"]  # a device-level metric: one row per physical GPU
    assert len(whole_gpu_rows) == sum(len(n.gpus) for n in sim.nodes.values())
    row = whole_gpu_rows[0]
    assert set(row.labels) >= GPU_LABELS
    node = sim.nodes[row.labels["Hostname"]]
    gpu = node.gpus[int(row.labels["gpu"])]
    assert (row.labels["UUID"], row.labels["pci_bus_id"]) == (gpu.uuid, gpu.pci_bus_id)
    assert row.labels["device"] == f"nvidia{gpu.index}" and row.labels["modelName"] == node.product.display_name

    def whole(name):
        return {(s.labels["Hostname"], s.labels["gpu"]): s.value for s in families[name] if "GPU_I_ID" not in s.labels}

    used, free = whole("DCGM_FI_DEV_FB_USED"), whole("DCGM_FI_DEV_FB_FREE")
    assert used[(node.name, "0")] + free[(node.name, "0")] == node.product.memory_mib


def test_mig_devices_have_their_own_samples(sim):
    _, text = fetch(sim, "/metrics?node=gpu-node-0010")  # all-balanced: 2x1g + 2g + 3g per GPU
    rows = samples(text)["DCGM_FI_DEV_FB_USED"]
    mig_rows = [r for r in rows if "GPU_I_PROFILE" in r.labels]
    assert len(mig_rows) == 8 * 4 and len(rows) == 8 * 5
    assert {r.labels["GPU_I_PROFILE"] for r in mig_rows} == {"1g.10gb", "2g.20gb", "3g.40gb"}
    assert {r.labels["Hostname"] for r in rows} == {"gpu-node-0010"}
    gpu0 = [r for r in mig_rows if r.labels["gpu"] == "0"]
    placed = sim.state("gpu-node-0010")["gpus"][0]["mig_devices"]  # 3g@4, 2g@0, 1g@2, 1g@3: GI ids 2, 3, 9, 10
    assert sorted(int(r.labels["GPU_I_ID"]) for r in gpu0) == sorted(d["gi_id"] for d in placed) == [2, 3, 9, 10]
    assert all(r.labels["UUID"] == sim.nodes["gpu-node-0010"].gpus[0].uuid for r in gpu0)


def test_node_proxy_path_serves_one_node_with_the_token(sim):
    status, _ = fetch(sim, "/api/v1/nodes/gpu-node-0001:9400/proxy/metrics")
    assert status == 401
    status, text = fetch(sim, "/api/v1/nodes/gpu-node-0001:9400/proxy/metrics", sim.token)
    assert status == 200
    assert {s.labels["Hostname"] for s in samples(text)["DCGM_FI_DEV_GPU_UTIL"]} == {"gpu-node-0001"}


def test_busy_gpus_run_hotter_and_show_their_pod(sim):
    node = sim.find_nodes(mig_capable=True, idle=True)[0]
    pod = sim.add_pod(node, "nvidia.com/gpu", 2, namespace="ml-training")
    util = {s.labels["gpu"]: s for s in samples(sim.metrics_text(node))["DCGM_FI_DEV_GPU_UTIL"]}
    busy = [s for s in util.values() if s.labels.get("pod") == pod["metadata"]["name"]]
    assert len(busy) == 2 and all(s.labels["namespace"] == "ml-training" for s in busy)
    assert min(s.value for s in busy) >= 50 > max(s.value for s in util.values() if "pod" not in s.labels)


def test_values_are_a_function_of_seed_gpu_and_time():
    node_a, node_b = generate_node(5, 0), generate_node(5, 0)
    at = 1_800_000_000.0
    first = metrics.node_samples(node_a, [], "mixed", 5, at, {})
    assert first == metrics.node_samples(node_b, [], "mixed", 5, at, {})
    later = metrics.node_samples(node_a, [], "mixed", 5, at + 60, {})
    assert [s.values for s in first] != [s.values for s in later]


def test_some_gpus_are_unhealthy_and_xids_can_be_injected(sim):
    sick = [gpu for i in range(3000) for gpu in generate_node(1, i).gpus if gpu.xid]
    assert {79, 48} <= {gpu.xid for gpu in sick}
    assert all(gpu.ecc_dbe > 0 for gpu in sick if gpu.xid == 48)
    sim.faults.update({"xid": {"gpu-node-0001": {"3": 43}}})
    xids = {s.labels["gpu"]: s.value for s in samples(sim.metrics_text("gpu-node-0001"))["DCGM_FI_DEV_XID_ERRORS"]}
    assert xids["3"] == 43


def test_a_node_paused_for_a_mig_change_exports_nothing(sim, core):
    node = "gpu-node-0002"
    sim.faults.update({"wedge": {node: 1}})  # stays paused: dcgm-exporter is one of the paused DaemonSets
    patch = {"metadata": {"labels": {"nvidia.com/mig.config": "all-balanced"}}}
    core.patch_node(node, patch, _content_type="application/merge-patch+json")
    assert sim.settle()
    assert sim.metrics_text(node) == "".join(metrics.render([]))
