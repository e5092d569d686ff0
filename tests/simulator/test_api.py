"""The official kubernetes client against the emulated API server over HTTPS: what Tessera's driver relies on."""

import json
import ssl
import threading
import urllib.request

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from simulator import Simulator
from tests.simulator.conftest import labels_of

MERGE = "application/merge-patch+json"


def raw_get(sim, path: str, token: str | None = None):
    """A request outside the client, to see status codes and bodies as they are on the wire."""
    context = ssl.create_default_context(cafile=sim.ca_path)
    request = urllib.request.Request(sim.url + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_list_and_get_nodes(sim, core):
    nodes = core.list_node()
    assert len(nodes.items) == 12
    assert int(nodes.metadata.resource_version) > 0
    node = core.read_node(nodes.items[0].metadata.name)
    assert node.kind == "Node" and node.api_version == "v1"
    assert node.status.node_info.kubelet_version.startswith("v1.32")
    assert any(c.type == "Ready" for c in node.status.conditions)
    assert "cpu" in node.status.allocatable and "memory" in node.status.capacity


def test_every_object_has_its_own_resource_version_from_one_counter(core):
    versions = [int(n.metadata.resource_version) for n in core.list_node().items]
    versions += [int(c.metadata.resource_version) for c in core.list_namespaced_config_map("gpu-operator").items]
    assert len(set(versions)) == len(versions)


def test_requests_without_the_token_get_a_401_status(sim):
    status, body, _ = raw_get(sim, "/api/v1/nodes")
    assert status == 401
    payload = json.loads(body)
    assert (payload["kind"], payload["code"], payload["reason"]) == ("Status", 401, "Unauthorized")
    assert raw_get(sim, "/api/v1/nodes", token="wrong")[0] == 401
    assert raw_get(sim, "/api/v1/nodes", token=sim.token)[0] == 200
    assert raw_get(sim, "/version")[0] == 200  # public, as with anonymous auth on a real cluster


def test_errors_are_status_objects(sim, core):
    with pytest.raises(ApiException) as error:
        core.read_node("no-such-node")
    payload = json.loads(error.value.body)
    assert error.value.status == 404
    assert payload == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'nodes "no-such-node" not found',
        "reason": "NotFound",
        "code": 404,
        "details": {"name": "no-such-node", "group": "", "kind": "nodes"},
    }


def test_discovery_lists_what_kubectl_needs(sim):
    _, body, _ = raw_get(sim, "/api/v1", sim.token)
    resources = {r["name"]: r for r in json.loads(body)["resources"]}
    assert {"nodes", "pods", "configmaps", "namespaces", "events", "nodes/proxy"} <= set(resources)
    assert resources["pods/eviction"]["group"] == "policy" and resources["pods/eviction"]["version"] == "v1"
    assert resources["nodes"]["shortNames"] == ["no"] and resources["configmaps"]["shortNames"] == ["cm"]
    _, body, _ = raw_get(sim, "/apis", sim.token)
    groups = {g["name"] for g in json.loads(body)["groups"]}
    assert {"apps", "policy", "nvidia.com"} <= groups
    _, body, _ = raw_get(sim, "/version")
    assert json.loads(body)["minor"] == "32"


def test_merge_patch_sets_and_null_deletes_labels(core):
    node = core.list_node().items[0].metadata.name
    core.patch_node(node, {"metadata": {"labels": {"tessera.io/pool": "a", "tessera.io/x": "1"}}}, _content_type=MERGE)
    assert labels_of(core, node)["tessera.io/pool"] == "a"
    core.patch_node(node, {"metadata": {"labels": {"tessera.io/pool": None}}}, _content_type=MERGE)
    labels = labels_of(core, node)
    assert "tessera.io/pool" not in labels and labels["tessera.io/x"] == "1"


def test_strategic_merge_patch_cordons_and_null_uncordons(core):
    node = core.list_node().items[1].metadata.name
    core.patch_node(node, {"spec": {"unschedulable": True}})  # a dict body is sent as strategic merge
    cordoned = core.read_node(node)
    assert cordoned.spec.unschedulable is True
    assert [t.key for t in cordoned.spec.taints] == ["node.kubernetes.io/unschedulable"]
    core.patch_node(node, {"spec": {"unschedulable": None}})
    uncordoned = core.read_node(node)
    assert uncordoned.spec.unschedulable is None and not uncordoned.spec.taints


def test_patching_status_through_the_main_resource_is_ignored(core):
    node = core.list_node().items[0]
    before = node.status.allocatable["cpu"]
    core.patch_node(node.metadata.name, {"status": {"allocatable": {"cpu": "1"}}}, _content_type=MERGE)
    assert core.read_node(node.metadata.name).status.allocatable["cpu"] == before


def test_label_selectors(core):
    core.patch_node("gpu-node-0001", {"metadata": {"labels": {"pool": "a"}}}, _content_type=MERGE)
    core.patch_node("gpu-node-0002", {"metadata": {"labels": {"pool": "b"}}}, _content_type=MERGE)

    def names(**selectors):
        return {n.metadata.name for n in core.list_node(**selectors).items}

    assert names(label_selector="pool=a") == {"gpu-node-0001"}
    assert names(label_selector="pool==b") == {"gpu-node-0002"}
    assert names(label_selector="pool in (a,b)") == {"gpu-node-0001", "gpu-node-0002"}
    assert names(label_selector="pool notin (a)") == names() - {"gpu-node-0001"}
    assert names(label_selector="pool!=a") == names() - {"gpu-node-0001"}
    assert names(label_selector="pool") == {"gpu-node-0001", "gpu-node-0002"}
    assert names(label_selector="!pool") == names() - {"gpu-node-0001", "gpu-node-0002"}
    assert names(label_selector="pool,nvidia.com/gpu.present=true") == {"gpu-node-0001", "gpu-node-0002"}
    assert names(field_selector="metadata.name=gpu-node-0003") == {"gpu-node-0003"}
    with pytest.raises(ApiException) as error:
        core.list_node(field_selector="spec.bogus=1")
    assert error.value.status == 400


def test_limit_and_continue_page_through_all_nodes(core):
    seen, token = [], None
    while True:
        page = core.list_node(limit=5, _continue=token)
        seen += [n.metadata.name for n in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert seen == sorted(seen) and len(seen) == 12


def test_json_patch_with_test_on_resource_version(core):
    node = core.read_node("gpu-node-0004")
    rv = node.metadata.resource_version
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/labels/tessera.io~1desired", "value": "all-balanced"},
    ]
    patched = core.patch_node("gpu-node-0004", ops)
    assert patched.metadata.labels["tessera.io/desired"] == "all-balanced"
    core.patch_node("gpu-node-0004", [{"op": "remove", "path": "/metadata/labels/tessera.io~1desired"}])
    assert "tessera.io/desired" not in labels_of(core, "gpu-node-0004")
    with pytest.raises(ApiException) as error:
        core.patch_node("gpu-node-0004", ops)  # rv is stale now
    assert error.value.status == 422


def test_replace_with_a_stale_resource_version_conflicts(core):
    stale = core.read_node("gpu-node-0005")
    core.patch_node("gpu-node-0005", {"metadata": {"labels": {"touched": "yes"}}}, _content_type=MERGE)
    stale.metadata.labels["mine"] = "1"
    with pytest.raises(ApiException) as error:
        core.replace_node("gpu-node-0005", stale)
    assert error.value.status == 409 and json.loads(error.value.body)["reason"] == "Conflict"
    fresh = core.read_node("gpu-node-0005")
    fresh.metadata.labels["mine"] = "1"
    assert core.replace_node("gpu-node-0005", fresh).metadata.labels["mine"] == "1"


def test_merge_patch_with_stale_resource_version_conflicts(core):
    rv = core.read_node("gpu-node-0006").metadata.resource_version
    core.patch_node("gpu-node-0006", {"metadata": {"labels": {"a": "1"}}}, _content_type=MERGE)
    with pytest.raises(ApiException) as error:
        core.patch_node(
            "gpu-node-0006", {"metadata": {"resourceVersion": rv, "labels": {"b": "2"}}}, _content_type=MERGE
        )
    assert error.value.status == 409


def test_same_value_patch_keeps_the_resource_version(core):
    node = core.read_node("gpu-node-0007")
    value = node.metadata.labels["kubernetes.io/os"]
    again = core.patch_node("gpu-node-0007", {"metadata": {"labels": {"kubernetes.io/os": value}}}, _content_type=MERGE)
    assert again.metadata.resource_version == node.metadata.resource_version


def test_watch_from_a_resource_version_sees_later_changes(core):
    rv = core.list_node().metadata.resource_version
    core.patch_node("gpu-node-0002", {"metadata": {"labels": {"watched": "1"}}}, _content_type=MERGE)
    events = []
    for event in watch.Watch().stream(
        core.list_node, field_selector="metadata.name=gpu-node-0002", resource_version=rv, timeout_seconds=1
    ):
        events.append(event)
        if event["object"].metadata.labels.get("watched") == "1":
            break
    assert events[-1]["type"] == "MODIFIED"
    assert int(events[-1]["object"].metadata.resource_version) > int(rv)


def test_watch_streams_changes_as_they_happen(core):
    rv = core.list_node().metadata.resource_version
    stream = watch.Watch().stream(core.list_node, label_selector="live", resource_version=rv, timeout_seconds=3)
    timer = threading.Timer(
        0.2, lambda: core.patch_node("gpu-node-0003", {"metadata": {"labels": {"live": "x"}}}, _content_type=MERGE)
    )
    timer.start()
    event = next(stream)
    timer.join()
    assert (event["type"], event["object"].metadata.name) == ("ADDED", "gpu-node-0003")  # entered the selection


def test_watch_from_a_compacted_resource_version_is_410():
    with Simulator(nodes=3, seed=1, watch_history=10, workload_pods=0) as small:
        core = client.CoreV1Api(config.new_client_from_config(config_file=small.kubeconfig_path))
        old = core.list_node().metadata.resource_version
        for i in range(30):
            core.patch_node("gpu-node-0001", {"metadata": {"labels": {"n": str(i)}}}, _content_type=MERGE)
        with pytest.raises(ApiException) as error:
            list(watch.Watch().stream(core.list_node, resource_version=old, timeout_seconds=1))
        assert error.value.status == 410


def test_configmap_crud(core):
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="tessera-cfg"), data={"k": "v1"})
    created = core.create_namespaced_config_map("gpu-operator", body)
    assert created.metadata.namespace == "gpu-operator" and created.data == {"k": "v1"}
    with pytest.raises(ApiException) as error:
        core.create_namespaced_config_map("gpu-operator", body)
    assert error.value.status == 409 and json.loads(error.value.body)["reason"] == "AlreadyExists"
    stale = core.read_namespaced_config_map("tessera-cfg", "gpu-operator")
    core.patch_namespaced_config_map("tessera-cfg", "gpu-operator", {"data": {"k": "v2"}})
    stale.data = {"k": "lost update"}
    with pytest.raises(ApiException) as error:
        core.replace_namespaced_config_map("tessera-cfg", "gpu-operator", stale)
    assert error.value.status == 409
    fresh = core.read_namespaced_config_map("tessera-cfg", "gpu-operator")
    fresh.data["k2"] = "x"
    assert core.replace_namespaced_config_map("tessera-cfg", "gpu-operator", fresh).data == {"k": "v2", "k2": "x"}
    names = [cm.metadata.name for cm in core.list_namespaced_config_map("gpu-operator").items]
    assert "tessera-cfg" in names and "default-mig-parted-config" in names
    core.delete_namespaced_config_map("tessera-cfg", "gpu-operator")
    with pytest.raises(ApiException) as error:
        core.read_namespaced_config_map("tessera-cfg", "gpu-operator")
    assert error.value.status == 404


def test_immutable_configmap_refuses_data_changes(core):
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="frozen"), data={"k": "v"}, immutable=True)
    core.create_namespaced_config_map("gpu-operator", body)
    with pytest.raises(ApiException) as error:
        core.patch_namespaced_config_map("frozen", "gpu-operator", {"data": {"k": "w"}})
    assert error.value.status == 422


def test_namespaces(core):
    names = {ns.metadata.name for ns in core.list_namespace().items}
    assert {"gpu-operator", "default", "kube-system", "ml-training", "inference", "research"} <= names
    assert core.read_namespace("gpu-operator").status.phase == "Active"


def test_pods_by_node_field_selector(sim, core):
    node = "gpu-node-0001"
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    assert pods and {p.spec.node_name for p in pods} == {node}
    assert any(p.metadata.name.startswith("nvidia-device-plugin-daemonset-") for p in pods)
    namespaced = core.list_namespaced_pod("gpu-operator", field_selector=f"spec.nodeName={node}").items
    assert {p.metadata.namespace for p in namespaced} == {"gpu-operator"}
    ds = client.AppsV1Api(core.api_client).read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "gpu-operator")
    assert ds.spec.template.spec.node_selector == {"nvidia.com/gpu.deploy.device-plugin": "true"}


def _evict(core, pod):
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace))
    return core.create_namespaced_pod_eviction(pod.metadata.name, pod.metadata.namespace, body)


def test_eviction_removes_the_pod_or_is_refused_with_429(sim, core):
    node = sim.find_nodes()[0]
    plain = client.V1Pod(**_pod_kwargs(sim.add_pod(node, namespace="ml-training")))
    protected = client.V1Pod(**_pod_kwargs(sim.add_pod(node, namespace="inference", protected=True)))
    counted = client.V1Pod(**_pod_kwargs(sim.add_pod(node, namespace="ml-training")))
    _evict(core, plain)
    with pytest.raises(ApiException) as error:
        core.read_namespaced_pod(plain.metadata.name, "ml-training")
    assert error.value.status == 404
    with pytest.raises(ApiException) as error:
        _evict(core, protected)
    assert error.value.status == 429
    assert json.loads(error.value.body)["details"]["causes"][0]["reason"] == "DisruptionBudget"
    sim.faults.update({"refuse_eviction": {f"ml-training/{counted.metadata.name}": 1}})
    with pytest.raises(ApiException) as error:
        _evict(core, counted)
    assert error.value.status == 429
    _evict(core, counted)  # the refusal count is used up
    core.delete_namespaced_pod(protected.metadata.name, "inference")  # deletion ignores disruption budgets


def _pod_kwargs(pod: dict) -> dict:
    meta = pod["metadata"]
    return {"metadata": client.V1ObjectMeta(name=meta["name"], namespace=meta["namespace"])}


def test_cluster_policy_read_and_merge_patch(custom):
    policy = custom.get_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy")
    assert policy["kind"] == "ClusterPolicy"
    assert policy["spec"]["migManager"]["config"]["name"] == ""  # per-node generated configs (GPU Operator >= v26.3)
    assert policy["spec"]["devicePlugin"]["config"]["name"] == "device-plugin-config"
    assert policy["spec"]["mig"]["strategy"] == "mixed"
    patched = custom.patch_cluster_custom_object(
        "nvidia.com",
        "v1",
        "clusterpolicies",
        "cluster-policy",
        {"spec": {"devicePlugin": {"config": {"name": "tessera-device-plugin", "default": "whole"}}}},
    )
    assert patched["spec"]["devicePlugin"]["config"] == {"name": "tessera-device-plugin", "default": "whole"}
    assert patched["spec"]["migManager"]["enabled"] is True


def test_fault_knobs_inject_errors_and_latency(sim, core):
    sim.faults.update({"error_rate": 1.0, "error_codes": [503]})
    with pytest.raises(ApiException) as error:
        core.list_node()
    assert error.value.status == 503
    sim.faults.update({"error_rate": 0.0, "write_error_rate": 1.0, "error_codes": [409]})
    core.list_node()  # reads are untouched by the write error rate
    with pytest.raises(ApiException) as error:
        core.patch_node("gpu-node-0001", {"metadata": {"labels": {"x": "1"}}}, _content_type=MERGE)
    assert error.value.status == 409
    sim.faults.update({"write_error_rate": 0.0, "error_rate": 1.0, "error_codes": [429]})
    status, _, headers = raw_get(sim, "/api/v1/nodes", sim.token)
    assert status == 429 and headers["Retry-After"] == "1"


def test_control_endpoint_sets_faults_and_reports_state(sim):
    context = ssl.create_default_context(cafile=sim.ca_path)
    request = urllib.request.Request(
        sim.url + "/_sim/faults",
        data=json.dumps({"latency_ms": 5, "wedge": {"gpu-node-0002": 1}}).encode(),
        headers={"Authorization": f"Bearer {sim.token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=context, timeout=5) as response:
        knobs = json.loads(response.read())
    assert knobs["latency_ms"] == 5.0 and knobs["wedge"] == {"gpu-node-0002": 1}
    status, body, _ = raw_get(sim, "/_sim/state?node=gpu-node-0002", sim.token)
    state = json.loads(body)
    assert status == 200 and state["gpus"][0]["uuid"].startswith("GPU-")
    assert raw_get(sim, "/_sim/state")[0] == 401
    status, body, _ = raw_get(sim, "/_sim/faults", sim.token)
    assert json.loads(body)["latency_ms"] == 5.0


def test_watch_is_dropped_after_n_events(sim, core):
    sim.faults.update({"watch_drop_after_events": 2})
    with pytest.raises(ProtocolError):  # the connection is cut mid-stream
        list(watch.Watch().stream(core.list_node, timeout_seconds=2))
