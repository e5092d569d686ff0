"""What QoS compliance reads from a cluster: kubelet configz, pods with their QoS class, node taints (§7.2, §7.3)."""

import json
import ssl
import urllib.request
from collections import Counter

import pytest
from kubernetes.client.exceptions import ApiException

from sharing.qos import BEST_EFFORT, BURSTABLE, GUARANTEED, parse_taint, qos_class, tolerates
from simulator.fleet import KUBELET_MIX, generate_node
from tests.simulator.conftest import wait_for

MERGE = "application/merge-patch+json"


def configz(core, node: str) -> dict:
    """The kubelet's configz through the API server's node proxy, with the official client. Without
    `_preload_content=False` the client hands back str() of the parsed JSON (a Python repr), not JSON."""
    response = core.connect_get_node_proxy_with_path(node, "configz", _preload_content=False)
    return json.loads(response.data)


def control(sim, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        sim.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {sim.token}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=sim.ca_path)
    try:
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


# --- kubelet configz -------------------------------------------------------------------------------------------------


def test_configz_serves_each_nodes_kubelet_configuration(sim, core, k8s):
    for name, node in sim.nodes.items():
        config = configz(core, name)["kubeletconfig"]
        assert config["topologyManagerPolicy"] == node.kubelet["topologyManagerPolicy"]
        assert config["cpuManagerPolicy"] == node.kubelet["cpuManagerPolicy"]
        assert config["topologyManagerScope"] == "container"
        assert config["maxPods"] == 110 and config["cgroupDriver"] == "systemd"
        assert ("reservedSystemCPUs" in config) == (config["cpuManagerPolicy"] == "static")
    node = next(iter(sim.nodes))
    # By the kubelet's port: the client percent-encodes the ':' and the server decodes it, as kube-apiserver does.
    by_port = core.connect_get_node_proxy_with_path(f"{node}:10250", "configz", _preload_content=False)
    assert json.loads(by_port.data) == configz(core, node)
    # The same through the client's generic call, with the ':' as `kubectl get --raw` sends it.
    response = k8s.call_api(
        "GET", f"{sim.url}/api/v1/nodes/{node}:10250/proxy/configz", {"Authorization": f"Bearer {sim.token}"}
    )
    response.read()
    assert json.loads(response.data) == configz(core, node)


def test_the_kubelet_mix_is_deterministic_and_mostly_defaults():
    kubelets = [generate_node(7, i).kubelet for i in range(1000)]
    assert kubelets == [generate_node(7, i).kubelet for i in range(1000)]
    mix = Counter((k["topologyManagerPolicy"], k["cpuManagerPolicy"]) for k in kubelets)
    assert set(mix) == {(topology, cpu) for _, topology, cpu in KUBELET_MIX}
    assert (
        mix[("none", "none")] > 600 and mix[("single-numa-node", "static")] > 100 and mix[("best-effort", "none")] > 50
    )


def test_the_control_endpoint_changes_what_a_kubelet_runs(sim, core):
    node = next(iter(sim.nodes))
    status, reply = control(
        sim,
        f"/_sim/nodes/{node}/kubelet-config",
        {"topologyManagerPolicy": "single-numa-node", "cpuManagerPolicy": "static"},
    )
    assert status == 200 and reply["kubelet"]["topologyManagerPolicy"] == "single-numa-node"
    config = configz(core, node)["kubeletconfig"]
    assert (config["topologyManagerPolicy"], config["cpuManagerPolicy"], config["reservedSystemCPUs"]) == (
        "single-numa-node",
        "static",
        "0-1",
    )
    sim.set_kubelet_config(node, topologyManagerScope="pod")  # the same from Python
    assert configz(core, node)["kubeletconfig"]["topologyManagerScope"] == "pod"

    status, reply = control(sim, f"/_sim/nodes/{node}/kubelet-config", {"topologyManagerPolicy": "strict"})
    assert status == 400 and "must be one of none, best-effort, restricted, single-numa-node" in reply["message"]
    status, reply = control(sim, f"/_sim/nodes/{node}/kubelet-config", {"maxPods": 10})
    assert status == 400 and "maxPods is not a kubelet setting" in reply["message"]
    assert control(sim, "/_sim/nodes/no-such-node/kubelet-config", {"cpuManagerPolicy": "none"})[0] == 404


def test_configz_of_a_node_whose_kubelet_is_down_is_503(sim, core):
    node = next(iter(sim.nodes))
    sim.set_ready(node, False)
    with pytest.raises(ApiException) as error:
        configz(core, node)
    assert error.value.status == 503 and "connect: connection refused" in json.loads(error.value.body)["message"]
    with pytest.raises(ApiException) as error:
        core.connect_get_node_proxy_with_path(node, "healthz")
    assert error.value.status == 503


# --- pods: resources, init containers, priority classes, tolerations, QoS class ---------------------------------------


@pytest.fixture
def pods(sim, core):
    """Every user pod as JSON (the form QoS checks read), after adding enough workload to see every shape."""
    sim.add_workload(40)
    raw = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
    return [pod for pod in raw if pod["metadata"]["namespace"] != "gpu-operator"]


def test_every_pods_qos_class_follows_kubernetes_rules(pods):
    assert len(pods) >= 30
    for pod in pods:
        assert pod["status"]["qosClass"] == qos_class(pod["spec"]), pod["metadata"]["name"]
    assert set(Counter(pod["status"]["qosClass"] for pod in pods)) == {GUARANTEED, BURSTABLE, BEST_EFFORT}


def test_pods_come_in_the_shapes_real_manifests_take(pods):
    def resources(pod):
        return [c.get("resources", {}) for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])]

    guaranteed = [pod for pod in pods if pod["status"]["qosClass"] == GUARANTEED]
    for pod in guaranteed:
        for res in resources(pod):
            assert {k: res["limits"][k] for k in ("cpu", "memory")} == {
                k: res["requests"][k] for k in ("cpu", "memory")
            }
    for pod in pods:  # the API server defaults a request from each limit (GPUs included)
        for res in resources(pod):
            assert set(res.get("limits", {})) <= set(res.get("requests", {}))
            assert all(res["requests"][name] == value for name, value in res.get("limits", {}).items() if "/" in name)
    best_effort = [pod for pod in pods if pod["status"]["qosClass"] == BEST_EFFORT]
    assert all(not ({"cpu", "memory"} & set(r.get("limits", {}))) for pod in best_effort for r in resources(pod))
    assert any(pod["spec"].get("initContainers") for pod in pods)
    assert all(pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
               for pod in pods if pod["spec"].get("initContainers"))  # fmt: skip
    # A Guaranteed-looking main container with a bare init container is Burstable, as Kubernetes decides.
    init_makes_burstable = [
        pod
        for pod in pods
        if pod["status"]["qosClass"] == BURSTABLE and qos_class({"containers": pod["spec"]["containers"]}) == GUARANTEED
    ]
    assert all(pod["spec"].get("initContainers") for pod in init_makes_burstable)


def test_priority_classes_and_pool_tolerations(pods):
    classes = Counter(pod["spec"].get("priorityClassName") for pod in pods)
    assert {"inference-high", "batch-low"} <= set(classes)
    priorities = {"inference-high": 100000, "batch-low": 1000, "research-normal": 5000, None: 0}
    assert all(pod["spec"]["priority"] == priorities[pod["spec"].get("priorityClassName")] for pod in pods)
    for pod in pods:
        keys = [t["key"] for t in pod["spec"]["tolerations"]]
        assert keys[:2] == ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]
    inference = parse_taint("tessera.io/pool=inference:NoSchedule")
    tolerating = [pod for pod in pods if tolerates(pod["spec"]["tolerations"], inference)]
    assert tolerating and len(tolerating) < len(pods)
    assert {pod["metadata"]["namespace"] for pod in tolerating} <= {"inference", "research"}


def test_the_official_client_reads_the_fields_qos_checks_use(sim, core):
    pod = sim.add_pod(next(iter(sim.nodes)), "nvidia.com/gpu", 1, namespace="inference")
    read = core.read_namespaced_pod(pod["metadata"]["name"], "inference")
    assert read.spec.priority_class_name == "inference-high" and read.spec.priority == 100000
    assert read.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert [t.key for t in read.spec.tolerations][:2] == [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ]
    assert read.status.qos_class == qos_class(pod["spec"])
    assert read.spec.init_containers is None or read.spec.init_containers[0].name in ("fetch-weights", "prepare")


# --- node taints -----------------------------------------------------------------------------------------------------


def test_taints_are_patchable_as_on_a_real_server(sim, core):
    node = next(iter(sim.nodes))
    pool_taint = {"key": "tessera.io/pool", "value": "inference", "effect": "NoSchedule"}
    core.patch_node(node, {"spec": {"taints": [pool_taint]}})  # strategic merge: the list is replaced
    assert [(t.key, t.value, t.effect) for t in core.read_node(node).spec.taints] == [
        ("tessera.io/pool", "inference", "NoSchedule")
    ]
    core.patch_node(node, {"spec": {"unschedulable": True}})  # cordon: the lifecycle controller's taint joins it
    assert [t.key for t in core.read_node(node).spec.taints] == ["tessera.io/pool", "node.kubernetes.io/unschedulable"]
    core.patch_node(node, {"spec": {"unschedulable": None}})
    core.patch_node(node, {"spec": {"taints": [dict(pool_taint, value="training")]}}, _content_type=MERGE)
    assert [t.value for t in core.read_node(node).spec.taints] == ["training"]
    watched = wait_for(lambda: sim.node(node)["spec"]["taints"])
    assert watched == [dict(pool_taint, value="training")]
    core.patch_node(node, {"spec": {"taints": None}}, _content_type=MERGE)
    assert core.read_node(node).spec.taints is None


@pytest.mark.parametrize(
    ("taints", "message"),
    [
        (
            [{"key": "tessera.io/pool", "value": "a", "effect": "Sometimes"}],
            'spec.taints[0].effect: Unsupported value: "Sometimes"',
        ),
        ([{"key": "tessera.io/pool", "value": "a"}], "spec.taints[0].effect: Required value"),
        ([{"key": "bad key", "effect": "NoSchedule"}], "spec.taints[0].key: Invalid value"),
        (
            [
                {"key": "tessera.io/pool", "value": "a", "effect": "NoSchedule"},
                {"key": "tessera.io/pool", "value": "b", "effect": "NoSchedule"},
            ],
            'spec.taints[1]: Duplicate value: "tessera.io/pool:NoSchedule"',
        ),
    ],
)
def test_invalid_taints_are_refused_with_422(sim, core, taints, message):
    node = next(iter(sim.nodes))
    with pytest.raises(ApiException) as error:
        core.patch_node(node, {"spec": {"taints": taints}})
    assert error.value.status == 422 and message in json.loads(error.value.body)["message"]
    assert not sim.node(node)["spec"].get("taints")
