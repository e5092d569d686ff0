"""dcgm-exporter metrics as the real exporter writes them (contracts §10): the operator's default counters, rows per
GPU and per MIG instance, the `hostname` label, XID rows with err_code/err_msg, served by each node's exporter pod
through the pod proxy (never the node proxy: the exporter has no hostPort)."""

import ssl
import urllib.request

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from simulator import Simulator, metrics
from simulator.fleet import generate_node

GPU_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "DCGM_FI_DRIVER_VERSION"}
MIG_NODE = "gpu-node-0010"  # all-balanced: 2x1g + 2g + 3g per GPU
REMAP_COUNTERS = {
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
}


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


def exporter_pod(core, node: str):
    pods = core.list_namespaced_pod(
        "gpu-operator", label_selector="app=nvidia-dcgm-exporter", field_selector=f"spec.nodeName={node}"
    ).items
    assert len(pods) == 1
    return pods[0]


def test_metrics_cover_every_gpu_with_the_default_counters(sim):
    status, text = fetch(sim, "/metrics")  # no token: the simulator's stand-in for one central endpoint
    assert status == 200
    families = samples(text)
    # ECC volatile totals are commented out in the operator's CSV, row-remap pending is not in it (contracts §10).
    assert set(families) == metrics.DEFAULT_COUNTERS
    assert not {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING"} & set(families)
    rows = families["DCGM_FI_DEV_GPU_TEMP"]  # device-level: one row per GPU, or per MIG instance
    expected = sum(len(g.mig_devices) if g.mig_enabled else 1 for n in sim.nodes.values() for g in n.gpus)
    assert len(rows) == expected
    row = next(r for r in rows if "GPU_I_ID" not in r.labels)
    assert set(row.labels) >= GPU_LABELS and "Hostname" not in row.labels
    node = sim.nodes[row.labels["hostname"]]
    gpu = node.gpus[int(row.labels["gpu"])]
    assert (row.labels["UUID"], row.labels["pci_bus_id"]) == (gpu.uuid, gpu.pci_bus_id)
    assert row.labels["device"] == f"nvidia{gpu.index}" and row.labels["modelName"] == node.product.display_name

    def whole(name):
        return {(s.labels["hostname"], s.labels["gpu"]): s.value for s in families[name] if "GPU_I_ID" not in s.labels}

    key = (node.name, row.labels["gpu"])
    assert whole("DCGM_FI_DEV_FB_USED")[key] + whole("DCGM_FI_DEV_FB_FREE")[key] == node.product.memory_mib


def test_a_mig_gpu_has_only_instance_rows(sim):
    families = samples(sim.metrics_text(MIG_NODE))
    fb = families["DCGM_FI_DEV_FB_USED"]
    assert len(fb) == 8 * 4 and all("GPU_I_PROFILE" in r.labels for r in fb)
    assert {r.labels["GPU_I_PROFILE"] for r in fb} == {"1g.10gb", "2g.20gb", "3g.40gb"}
    gpu0 = [r for r in fb if r.labels["gpu"] == "0"]
    placed = sim.state(MIG_NODE)["gpus"][0]["mig_devices"]  # 3g@4, 2g@0, 1g@2, 1g@3: GI ids 2, 3, 9, 10
    assert sorted(int(r.labels["GPU_I_ID"]) for r in gpu0) == sorted(d["gi_id"] for d in placed) == [2, 3, 9, 10]
    assert all(r.labels["UUID"] == sim.nodes[MIG_NODE].gpus[0].uuid for r in gpu0)
    # Each instance has its memory and graphics engine activity; the GPU's fields repeat on each instance row.
    free = {r.labels["GPU_I_ID"]: r.value for r in families["DCGM_FI_DEV_FB_FREE"] if r.labels["gpu"] == "0"}
    used = {r.labels["GPU_I_ID"]: r.value for r in gpu0}
    product = sim.nodes[MIG_NODE].product
    for r in gpu0:
        total = product.mig_profile(r.labels["GPU_I_PROFILE"]).memory_mib
        assert used[r.labels["GPU_I_ID"]] + free[r.labels["GPU_I_ID"]] == total
    assert len(families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == 8 * 4
    temps = {r.value for r in families["DCGM_FI_DEV_GPU_TEMP"] if r.labels["gpu"] == "0"}
    assert len(families["DCGM_FI_DEV_GPU_TEMP"]) == 8 * 4 and len(temps) == 1
    # Not supported with MIG: no utilisation and no remapped rows for these GPUs.
    assert "DCGM_FI_DEV_GPU_UTIL" not in families or not families["DCGM_FI_DEV_GPU_UTIL"]
    assert all(not families.get(name) for name in REMAP_COUNTERS)


def test_the_xid_row_names_its_error(sim):
    sim.faults.update({"xid": {"gpu-node-0001": {"3": 79}}})
    rows = samples(sim.metrics_text("gpu-node-0001"))["DCGM_FI_DEV_XID_ERRORS"]
    by_gpu = {r.labels["gpu"]: r for r in rows}
    assert by_gpu["3"].value == 79
    assert (by_gpu["3"].labels["err_code"], by_gpu["3"].labels["err_msg"]) == ("79", "GPU has fallen off the bus")
    assert by_gpu["0"].labels["err_msg"] == "No Error"


def test_each_exporter_pod_serves_its_node_through_the_pod_proxy(sim, core):
    node = "gpu-node-0001"
    pod = exporter_pod(core, node)
    container = pod.spec.containers[0]
    assert [(p.name, p.container_port, p.host_port) for p in container.ports] == [("metrics", 9400, None)]
    assert not pod.spec.host_network and pod.status.pod_ip != pod.status.host_ip
    assert {e.name for e in container.env} >= {"NODE_NAME", "DCGM_EXPORTER_COLLECTORS"}
    text = core.connect_get_namespaced_pod_proxy_with_path(f"{pod.metadata.name}:9400", "gpu-operator", "metrics")
    assert {s.labels["hostname"] for s in samples(text)["DCGM_FI_DEV_GPU_TEMP"]} == {node}
    # The operator's Service selects the same pods.
    service = core.read_namespaced_service("nvidia-dcgm-exporter", "gpu-operator")
    assert service.spec.selector == {"app": "nvidia-dcgm-exporter"}
    assert [(p.name, p.port) for p in service.spec.ports] == [("gpu-metrics", 9400)]
    status, _ = fetch(sim, f"/api/v1/namespaces/gpu-operator/pods/{pod.metadata.name}:9400/proxy/metrics")
    assert status == 401  # the API server's proxy needs the token


def test_nothing_listens_on_the_nodes_port_9400(sim, core):
    with pytest.raises(ApiException) as error:
        core.connect_get_node_proxy_with_path("gpu-node-0001:9400", "metrics")
    assert error.value.status == 503 and "connection refused" in error.value.body
    other = exporter_pod(core, "gpu-node-0002").metadata.name
    with pytest.raises(ApiException) as error:
        core.connect_get_namespaced_pod_proxy_with_path(f"{other}:9401", "gpu-operator", "metrics")
    assert error.value.status == 503


def test_a_custom_csv_and_an_older_exporter(sim):
    """Optional counters appear once a custom CSV enables them; releases before the rename say `Hostname`."""
    node = generate_node(7, 0)
    node.gpus[1].remap_pending, node.gpus[1].ecc_dbe = True, 2
    rows = metrics.node_samples(node, [], "mixed", 7, 1_800_000_000.0, {}, host_label="Hostname")
    counters = metrics.DEFAULT_COUNTERS | {"DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"}
    families = samples("".join(metrics.render(rows, counters)))
    pending = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_ROW_REMAP_PENDING"]}
    assert pending["1"] == 1 and pending["0"] == 0
    assert {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]}["1"] == 2
    assert all("Hostname" in s.labels and "hostname" not in s.labels for s in families["DCGM_FI_DEV_GPU_TEMP"])
    with pytest.raises(ValueError, match="unknown dcgm counters"):
        Simulator(nodes=1, dcgm_counters=["DCGM_FI_DEV_NOT_A_FIELD"])


def test_row_remapping_is_exported_from_ampere_on(sim):
    families = samples(sim.metrics_text())
    remapped = {(s.labels["hostname"], s.labels["gpu"]) for s in families["DCGM_FI_DEV_ROW_REMAP_FAILURE"]}
    for node in sim.nodes.values():
        for gpu in node.gpus:
            supported = node.product.architecture in metrics.REMAP_ARCHITECTURES and not gpu.mig_enabled
            assert ((node.name, str(gpu.index)) in remapped) == (supported and node.ready)
    worn = [gpu for i in range(3000) for gpu in generate_node(1, i).gpus if gpu.remap_pending or gpu.remap_failure]
    assert any(g.remap_failure and g.xid == 64 for g in worn)
    assert all(g.remapped_uncorrectable == g.ecc_dbe > 0 for g in worn if g.remap_pending)


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
