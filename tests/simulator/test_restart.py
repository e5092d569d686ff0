"""A restart keeps the cluster: `python -m simulator` stopped (SIGTERM, or SIGKILL after a write) and started again
with the same state directory and port serves the nodes, MIG configs, pods and ConfigMaps as they were, to the same
kubeconfig; watches go on after a clean stop and get 410 Gone after a crash; an apply in flight runs again."""

import json
import signal
import ssl
import time
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from simulator import Simulator
from simulator.persist import CRASH_RV_JUMP, STATE_FILE
from simulator.resources import CLUSTER_POLICIES, NODES, PODS
from tests.processes import SimulatorProcess, free_port
from tests.simulator.conftest import wait_for

MERGE = "application/merge-patch+json"
IDLE_H100 = "gpu-node-0002"  # MIG-capable, no pod, on all-disabled (seed 7, 12 nodes)
MIG_CONFIG, MIG_STATE = "nvidia.com/mig.config", "nvidia.com/mig.config.state"


def raw_get(core: client.CoreV1Api, path: str) -> dict:
    """GET with the client's own token and CA (those of the kubeconfig it was made from), the JSON as served."""
    settings = core.api_client.configuration
    request = urllib.request.Request(
        settings.host + path, headers={"Authorization": settings.get_api_key_with_prefix("BearerToken")}
    )
    context = ssl.create_default_context(cafile=settings.ssl_ca_cert)
    with urllib.request.urlopen(request, context=context, timeout=10) as reply:
        return json.loads(reply.read())


def sim_state(core: client.CoreV1Api, node: str | None = None) -> dict:
    return raw_get(core, "/_sim/state" + (f"?node={node}" if node else ""))


def labels(core, node: str) -> dict:
    return core.read_node(node).metadata.labels


def change_the_cluster(core: client.CoreV1Api) -> None:
    """What an admin and Tessera do: labels, a taint, a cordon, a MIG config, a ConfigMap, a pod deleted."""
    core.patch_node("gpu-node-0001", {"metadata": {"labels": {"tessera.io/pool": "inference"}}}, _content_type=MERGE)
    taint = {"key": "tessera.io/pool", "value": "inference", "effect": "NoSchedule"}
    core.patch_node("gpu-node-0001", {"spec": {"taints": [taint], "unschedulable": True}}, _content_type=MERGE)
    core.patch_node(IDLE_H100, {"metadata": {"labels": {MIG_CONFIG: "all-balanced"}}}, _content_type=MERGE)
    # The state label says "success" from the node's first config until the operator sees the new one: wait for the
    # GPUs themselves, not only the label (under load the label alone raced).
    wait_for(
        lambda: (
            labels(core, IDLE_H100).get(MIG_STATE) == "success"
            and all(g["mig_enabled"] for g in sim_state(core, IDLE_H100)["gpus"])
        ),
        timeout=20,
    )
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="tessera-profiles"), data={"k": "v"})
    core.create_namespaced_config_map("gpu-operator", body)
    pod = next(p for p in core.list_pod_for_all_namespaces().items if p.metadata.namespace == "inference")
    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)


def cluster_view(core: client.CoreV1Api) -> dict:
    """Everything compared across a restart: the objects as served, and the simulated GPUs of the changed node."""
    view = {path: raw_get(core, path)["items"] for path in ("/api/v1/nodes", "/api/v1/pods", "/api/v1/configmaps")}
    view["gpus"] = sim_state(core, IDLE_H100)["gpus"]
    return view


def test_a_clean_restart_serves_the_same_cluster_and_watches_go_on(tmp_path):
    port = free_port()
    first = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
    core = first.core()
    change_the_cluster(core)
    before = cluster_view(core)
    rv = int(core.list_node().metadata.resource_version)
    assert first.stop(signal.SIGTERM) == 0

    second = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
    try:
        assert "stopped cleanly" in second.stderr()
        # The client made before the restart works on: same port, token and certificate.
        assert cluster_view(core) == before
        assert labels(core, "gpu-node-0001")["tessera.io/pool"] == "inference"
        assert core.read_node("gpu-node-0001").spec.unschedulable is True
        assert [g["mig_enabled"] for g in before["gpus"]] == [True] * 8
        assert int(core.list_node().metadata.resource_version) == rv
        assert sim_state(core)["restored"] is True

        stream = watch.Watch().stream(core.list_node, resource_version=str(rv), timeout_seconds=5)
        core.patch_node("gpu-node-0003", {"metadata": {"labels": {"after": "restart"}}}, _content_type=MERGE)
        event = next(stream)
        assert (event["type"], event["object"].metadata.name) == ("MODIFIED", "gpu-node-0003")
        assert int(event["object"].metadata.resource_version) == rv + 1
        stream.close()
        with pytest.raises(ApiException) as gone:  # older than the restart: no history kept, list again
            list(watch.Watch().stream(core.list_node, resource_version=str(rv - 1), timeout_seconds=2))
        assert gone.value.status == 410
    finally:
        second.stop()


def test_a_killed_simulator_comes_back_as_last_written_and_old_watches_get_410(tmp_path):
    port = free_port()
    first = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
    core = first.core()
    change_the_cluster(core)
    before = cluster_view(core)
    rv = int(core.list_node().metadata.resource_version)
    first.wait_saved(rv)  # a second or so after the last change
    first.stop(signal.SIGKILL)

    second = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
    assert "not stopped cleanly" in second.stderr()
    assert cluster_view(core) == before
    assert labels(core, IDLE_H100)[MIG_CONFIG] == "all-balanced"
    # Versions the killed run may have handed out after its last write are never handed out again.
    assert int(core.list_node().metadata.resource_version) >= rv + CRASH_RV_JUMP
    with pytest.raises(ApiException) as gone:
        list(watch.Watch().stream(core.list_node, resource_version=str(rv), timeout_seconds=2))
    assert gone.value.status == 410
    # Killed again before it wrote anything: its versions are not handed out a second time either.
    seen = core.patch_node("gpu-node-0004", {"metadata": {"labels": {"x": "1"}}}, _content_type=MERGE)
    second.stop(signal.SIGKILL)
    third = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
    try:
        assert int(core.list_node().metadata.resource_version) > int(seen.metadata.resource_version)
        assert labels(core, IDLE_H100)[MIG_CONFIG] == "all-balanced"
    finally:
        third.stop()


def test_an_apply_caught_in_flight_runs_again_after_the_restart(tmp_path):
    port = free_port()
    first = SimulatorProcess(tmp_path, port, "--apply-delay", "60")
    core = first.core()
    core.patch_node(IDLE_H100, {"metadata": {"labels": {MIG_CONFIG: "all-balanced"}}}, _content_type=MERGE)
    wait_for(lambda: labels(core, IDLE_H100).get(MIG_STATE) == "pending", timeout=10)
    assert labels(core, IDLE_H100)["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"
    first.wait_saved(int(core.list_node().metadata.resource_version))
    first.stop(signal.SIGKILL)

    second = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
    try:
        assert f"apply again on {IDLE_H100}" in second.stderr()
        wait_for(lambda: labels(core, IDLE_H100).get(MIG_STATE) == "success", timeout=20)
        assert labels(core, IDLE_H100)["nvidia.com/gpu.deploy.device-plugin"] == "true"
        assert all(gpu["mig_enabled"] and gpu["mig_devices"] for gpu in sim_state(core, IDLE_H100)["gpus"])
        plugin_pods = core.list_namespaced_pod("gpu-operator", field_selector=f"spec.nodeName={IDLE_H100}").items
        assert "nvidia-device-plugin-daemonset" in {p.metadata.labels["app"] for p in plugin_pods}
    finally:
        second.stop()


def test_another_seed_or_node_count_starts_a_fresh_fleet_and_says_so(tmp_path):
    port = free_port()
    first = SimulatorProcess(tmp_path, port, nodes=4, seed=3)
    old = first.core().patch_node("gpu-node-0001", {"metadata": {"labels": {"kept": "no"}}}, _content_type=MERGE)
    assert first.stop() == 0

    second = SimulatorProcess(tmp_path, port, nodes=5, seed=3)
    try:
        assert "it was saved for seed=3 nodes=4" in second.stderr()
        assert "this simulator runs seed=3 nodes=5" in second.stderr()
        core = second.core()
        nodes = core.list_node()
        assert len(nodes.items) == 5 and "kept" not in labels(core, "gpu-node-0001")
        # Versions start above the old cluster's: a watch from one of those gets 410 and lists again.
        assert int(nodes.items[0].metadata.resource_version) > int(old.metadata.resource_version)
    finally:
        second.stop()
    third = SimulatorProcess(tmp_path, port, nodes=5, seed=4)
    try:
        assert "it was saved for seed=3 nodes=5" in third.stderr()
    finally:
        third.stop()


def test_the_state_file_is_always_whole_while_it_is_rewritten(tmp_path):
    with Simulator(nodes=12, seed=7, apply_delay=0.0, state_dir=str(tmp_path), save_interval=0.01) as sim:
        path = tmp_path / STATE_FILE
        wait_for(path.exists)
        for round_ in range(150):
            sim.store.mutate(
                NODES, "", "gpu-node-0001", lambda obj, n=round_: obj["metadata"]["labels"].update(n=str(n))
            )
            document = json.loads(path.read_bytes())  # never a half-written file
            assert document["fleet"]["nodes"] == 12 and len(document["objects"]["nodes"]) == 12
        wait_for(lambda: json.loads(path.read_bytes())["resource_version"] == sim.store.resource_version)


def test_fresh_starts_from_the_seed_and_a_zero_save_interval_keeps_nothing(tmp_path, capsys):
    options = {"nodes": 3, "seed": 2, "apply_delay": 0.0, "state_dir": str(tmp_path)}
    with Simulator(**options) as sim:
        sim.store.mutate(NODES, "", "gpu-node-0001", lambda obj: obj["metadata"]["labels"].update(kept="yes"))
    with Simulator(**options) as sim:
        assert sim.restored and sim.node("gpu-node-0001")["metadata"]["labels"]["kept"] == "yes"
    with Simulator(**options, fresh=True) as sim:
        assert not sim.restored and "kept" not in sim.node("gpu-node-0001")["metadata"]["labels"]
    assert ": --fresh; starting a fresh fleet" in capsys.readouterr().err
    (tmp_path / STATE_FILE).unlink()
    with Simulator(**options, save_interval=0) as sim:
        sim.store.mutate(NODES, "", "gpu-node-0001", lambda obj: obj["metadata"]["labels"].update(kept="yes"))
    assert not (tmp_path / STATE_FILE).exists()


L4 = "gpu-node-0006"  # no MIG, plugin config from its label
PLUGIN_CONFIG = "nvidia.com/device-plugin.config"


def plugin_pods(sim) -> dict[str, str]:
    return {node: sim.daemonsets.pod_on("nvidia-device-plugin-daemonset", node)["metadata"]["name"]
            for node in sim.nodes}  # fmt: skip


def test_changes_saved_before_the_operator_saw_them_are_taken_up_after_the_restart(tmp_path):
    options = {"nodes": 12, "seed": 7, "apply_delay": 0.0, "state_dir": str(tmp_path)}
    with Simulator(**options) as sim:
        dcgm = sim.daemonsets.pod_on("nvidia-dcgm-exporter", "gpu-node-0001")["metadata"]["name"]
        plugins = plugin_pods(sim)
        sim.operator.stop()  # the changes below are saved, their reactions stay queued: a snapshot cut between
        sim.store.mutate(
            NODES, "", IDLE_H100, lambda obj: obj["metadata"]["labels"].update({MIG_CONFIG: "all-1g.10gb"})
        )
        sim.store.mutate(NODES, "", L4, lambda obj: obj["metadata"]["labels"].update({PLUGIN_CONFIG: "mps-4"}))
        sim.store.delete(PODS, "gpu-operator", dcgm)
        policy = sim.store.find(CLUSTER_POLICIES, "", "cluster-policy")
        sim.store.mutate(
            CLUSTER_POLICIES, "", "cluster-policy", lambda obj: obj["spec"]["mig"].update(strategy="single")
        )
        assert policy["spec"]["mig"]["strategy"] == "mixed"
    with Simulator(**options) as sim:
        assert sim.settle()
        labels = sim.node(IDLE_H100)["metadata"]["labels"]
        assert labels[MIG_STATE] == "success" and labels["nvidia.com/mig.strategy"] == "single"
        assert all(len(gpu.mig_devices) == 7 for gpu in sim.nodes[IDLE_H100].gpus)
        assert sim.node(L4)["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "mps"
        assert sim.daemonsets.pod_on("nvidia-dcgm-exporter", "gpu-node-0001") is not None
        assert all(plugin_pods(sim)[node] != name for node, name in plugins.items())  # the policy change restarts


def test_a_node_caught_rebooting_comes_back_ready_and_applies(tmp_path):
    options = {"nodes": 12, "seed": 7, "state_dir": str(tmp_path)}
    with Simulator(**options, apply_delay=1.0, faults={"reboot_nodes": [IDLE_H100]}) as sim:
        sim.store.mutate(
            NODES, "", IDLE_H100, lambda obj: obj["metadata"]["labels"].update({MIG_CONFIG: "all-balanced"})
        )
        wait_for(lambda: sim.node(IDLE_H100)["metadata"]["labels"][MIG_STATE] == "pending")
        time.sleep(0.3)  # the first step is under way (1 s); the reboot that follows never ends before the stop
        sim.faults.update({"apply_delay": 60.0})
        wait_for(lambda: sim.node(IDLE_H100)["metadata"]["labels"][MIG_STATE] == "rebooting")
        assert not sim.nodes[IDLE_H100].ready
    with Simulator(**options, apply_delay=0.0) as sim:
        assert sim.settle()
        assert sim.node(IDLE_H100)["metadata"]["labels"][MIG_STATE] == "success"
        assert sim.nodes[IDLE_H100].ready
        ready = next(c for c in sim.node(IDLE_H100)["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert all(gpu.mig_enabled and gpu.mig_devices for gpu in sim.nodes[IDLE_H100].gpus)
