"""GPU Operator behaviour, sharp edges included (contracts §1 MIG Manager, §3 device plugin and GFD)."""

import json
import ssl
import urllib.request

import yaml
from kubernetes import client, config, watch

from simulator import Simulator
from tests.simulator.conftest import labels_of, mig_state, wait_for

MERGE = "application/merge-patch+json"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
PLUGIN_CONFIG = "nvidia.com/device-plugin.config"
# Fleet of the `sim` fixture (seed 7): fixed by the seed, checked by test_fixture_fleet_is_as_expected.
H100_IDLE = "gpu-node-0002"
H100_IDLE_2 = "gpu-node-0005"
H100_BALANCED = "gpu-node-0010"
L4 = "gpu-node-0006"


def label(core, node: str, key: str, value: str | None) -> None:
    core.patch_node(node, {"metadata": {"labels": {key: value}}}, _content_type=MERGE)


def mig_states(core, node: str, change, timeout: int = 5, plugin_deploy: set | None = None) -> list[str]:
    """States the node's mig.config.state label passes through after `change()`, read from a watch; the device
    plugin's deploy label values seen on the way are added to `plugin_deploy`."""
    rv = core.read_node(node).metadata.resource_version
    change()
    seen: list[str] = []
    stream = watch.Watch().stream(
        core.list_node, field_selector=f"metadata.name={node}", resource_version=rv, timeout_seconds=timeout
    )
    for event in stream:
        labels = event["object"].metadata.labels
        if plugin_deploy is not None:
            plugin_deploy.add(labels.get("nvidia.com/gpu.deploy.device-plugin"))
        state = labels.get(MIG_STATE)
        if not seen or seen[-1] != state:
            seen.append(state)
        if len(seen) > 1 and state in ("success", "failed"):
            break
    return seen


def gpu_allocatable(core, node: str) -> dict[str, str]:
    allocatable = core.read_node(node).status.allocatable
    return {k: v for k, v in allocatable.items() if k.startswith("nvidia.com/") and v != "0"}


def control(sim, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        sim.url + path,
        data=json.dumps(body or {}).encode(),
        headers={"Authorization": f"Bearer {sim.token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=sim.ca_path), timeout=5) as reply:
        return json.loads(reply.read())


def mig_configmap(core, name: str, configs: dict) -> None:
    text = yaml.safe_dump({"version": "v1", "mig-configs": configs})
    core.create_namespaced_config_map(
        "gpu-operator", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"config.yaml": text})
    )


def point_mig_manager_at(custom, sim, name: str) -> None:
    custom.patch_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", "cluster-policy", {"spec": {"migManager": {"config": {"name": name}}}}
    )
    assert sim.settle()


def test_fixture_fleet_is_as_expected(sim):
    assert sim.nodes[H100_IDLE].product.name == "NVIDIA-H100-80GB-HBM3"
    assert sim.nodes[H100_IDLE_2].product.name == "NVIDIA-H100-80GB-HBM3"
    assert sim.nodes[H100_BALANCED].product.name == "NVIDIA-H100-80GB-HBM3"
    assert sim.nodes[L4].product.name == "NVIDIA-L4"
    assert {H100_IDLE, H100_IDLE_2, H100_BALANCED} <= set(sim.find_nodes(mig_capable=True, idle=True))
    assert sim.node(H100_BALANCED)["metadata"]["labels"][MIG_CONFIG] == "all-balanced"


def test_mig_config_change_goes_pending_then_success(sim, core):
    deploy: set[str] = set()

    def change():
        label(core, H100_IDLE, MIG_CONFIG, "all-1g.10gb")

    assert mig_states(core, H100_IDLE, change, plugin_deploy=deploy) == ["success", "pending", "success"]
    # The deploy labels were paused while the GPUs were reconfigured (contracts §1.2 step 7).
    assert deploy == {"true", "paused-for-mig-change"}
    labels = labels_of(core, H100_IDLE)
    assert labels["nvidia.com/mig-1g.10gb.count"] == "56"
    assert labels["nvidia.com/mig-1g.10gb.memory"] == "9984"
    assert labels["nvidia.com/mig-1g.10gb.multiprocessors"] == "16"
    assert labels["nvidia.com/gpu.replicas"] == "0"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert gpu_allocatable(core, H100_IDLE) == {"nvidia.com/mig-1g.10gb": "56"}
    assert all(gpu["mig_enabled"] and len(gpu["mig_devices"]) == 7 for gpu in sim.state(H100_IDLE)["gpus"])


def test_writing_the_same_value_again_does_nothing(sim, core):
    label(core, H100_IDLE, MIG_CONFIG, "all-unknown")
    assert sim.settle() and mig_state(core, H100_IDLE) == "failed"
    rv = core.read_node(H100_IDLE).metadata.resource_version
    label(core, H100_IDLE, MIG_CONFIG, "all-unknown")  # no retry: MIG Manager only reacts to a change
    assert sim.settle()
    node = core.read_node(H100_IDLE)
    assert node.metadata.resource_version == rv and node.metadata.labels[MIG_STATE] == "failed"


def test_unknown_config_name_fails_without_pending(sim, core):
    assert mig_states(core, H100_IDLE, lambda: label(core, H100_IDLE, MIG_CONFIG, "all-7g.99gb")) == [
        "success",
        "failed",
    ]
    assert "all-7g.99gb" in sim.state(H100_IDLE)["mig_manager"]["last_error"]


def test_layout_that_does_not_fit_fails_after_pending(sim, core, custom):
    mig_configmap(
        core,
        "tessera-mig",
        {
            "all-disabled": [{"devices": "all", "mig-enabled": False}],
            "too-big": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2, "2g.20gb": 1}}],
            "bad-index": [{"devices": [9], "mig-enabled": True, "mig-devices": {"1g.10gb": 1}}],
        },
    )
    point_mig_manager_at(custom, sim, "tessera-mig")
    assert mig_state(core, H100_IDLE) == "success"  # all-disabled is still defined
    assert mig_state(core, H100_BALANCED) == "failed"  # all-balanced is not in the new config
    assert mig_states(core, H100_IDLE, lambda: label(core, H100_IDLE, MIG_CONFIG, "too-big")) == [
        "success",
        "pending",
        "failed",
    ]
    assert "GPU 0" in sim.state(H100_IDLE)["mig_manager"]["last_error"]
    assert labels_of(core, H100_IDLE)["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert mig_states(core, H100_IDLE_2, lambda: label(core, H100_IDLE_2, MIG_CONFIG, "bad-index"))[-1] == "failed"


def test_edited_mig_parted_configmap_is_read_at_the_next_apply(sim, core, custom):
    mig_configmap(
        core, "tessera-mig", {"day": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]}
    )
    point_mig_manager_at(custom, sim, "tessera-mig")
    text = yaml.safe_dump(
        {
            "version": "v1",
            "mig-configs": {"day": [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}]},
        }
    )
    core.patch_namespaced_config_map("tessera-mig", "gpu-operator", {"data": {"config.yaml": text}})
    assert mig_states(core, H100_IDLE, lambda: label(core, H100_IDLE, MIG_CONFIG, "day"))[-1] == "success"
    assert gpu_allocatable(core, H100_IDLE) == {"nvidia.com/mig-7g.80gb": "8"}


def test_a_pod_holding_a_gpu_makes_the_apply_fail(sim, core):
    pod = sim.add_pod(H100_IDLE, "nvidia.com/gpu", 1, namespace="ml-training")
    assert mig_states(core, H100_IDLE, lambda: label(core, H100_IDLE, MIG_CONFIG, "all-balanced")) == [
        "success",
        "pending",
        "failed",
    ]
    assert pod["metadata"]["name"] in sim.state(H100_IDLE)["mig_manager"]["last_error"]
    core.delete_namespaced_pod(pod["metadata"]["name"], "ml-training")
    assert mig_states(core, H100_IDLE, lambda: label(core, H100_IDLE, MIG_CONFIG, "all-1g.20gb"))[-1] == "success"


def test_a_wedged_mig_manager_stays_pending_until_its_pod_restarts(sim, core):
    sim.faults.update({"wedge": {H100_IDLE: 1}})
    label(core, H100_IDLE, MIG_CONFIG, "all-balanced")
    assert sim.settle()
    labels = labels_of(core, H100_IDLE)
    assert labels[MIG_STATE] == "pending"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "paused-for-mig-change"
    assert control(sim, f"/_sim/nodes/{H100_IDLE}/restart-mig-manager") == {
        "node": H100_IDLE,
        "action": "restart-mig-manager",
    }
    assert sim.settle() and mig_state(core, H100_IDLE) == "success"
    assert labels_of(core, H100_IDLE)["nvidia.com/mig-3g.40gb.count"] == "8"


def test_deleting_the_mig_manager_pod_unwedges_the_node(sim, core):
    sim.faults.update({"wedge": {H100_IDLE: 1}})
    label(core, H100_IDLE, MIG_CONFIG, "all-balanced")
    assert sim.settle() and mig_state(core, H100_IDLE) == "pending"
    selector = f"spec.nodeName={H100_IDLE}"
    pod = next(
        p
        for p in core.list_namespaced_pod("gpu-operator", field_selector=selector).items
        if "mig-manager" in p.metadata.name
    )
    core.delete_namespaced_pod(pod.metadata.name, "gpu-operator")
    assert sim.settle() and mig_state(core, H100_IDLE) == "success"
    names = {p.metadata.name for p in core.list_namespaced_pod("gpu-operator", field_selector=selector).items}
    assert pod.metadata.name not in names and any(n.startswith("nvidia-mig-manager-") for n in names)


def test_a_wedged_node_also_proceeds_on_a_label_change(sim, core):
    sim.faults.update({"wedge": {H100_IDLE: 1}})
    label(core, H100_IDLE, MIG_CONFIG, "all-balanced")
    assert sim.settle() and mig_state(core, H100_IDLE) == "pending"
    assert mig_states(core, H100_IDLE, lambda: label(core, H100_IDLE, MIG_CONFIG, "all-3g.40gb"))[-1] == "success"


def test_mig_mode_change_reboots_a_node_set_to_reboot(sim, core):
    sim.faults.update({"reboot_nodes": [H100_IDLE], "apply_delay": 0.05})

    def change():
        label(core, H100_IDLE, MIG_CONFIG, "all-1g.10gb")

    assert mig_states(core, H100_IDLE, change) == ["success", "pending", "rebooting", "success"]
    node = core.read_node(H100_IDLE)
    assert next(c.status for c in node.status.conditions if c.type == "Ready") == "True"
    # A geometry-only change needs no reset, so no reboot (contracts §1.3).
    assert mig_states(core, H100_IDLE, lambda: label(core, H100_IDLE, MIG_CONFIG, "all-balanced")) == [
        "success",
        "pending",
        "success",
    ]


def test_the_node_is_not_ready_while_it_reboots(sim, core):
    sim.faults.update({"reboot_nodes": [H100_IDLE], "apply_delay": 0.3})
    label(core, H100_IDLE, MIG_CONFIG, "all-1g.10gb")
    wait_for(lambda: mig_state(core, H100_IDLE) == "rebooting")
    conditions = core.read_node(H100_IDLE).status.conditions
    assert next(c.status for c in conditions if c.type == "Ready") == "Unknown"
    assert sim.settle() and mig_state(core, H100_IDLE) == "success"


def test_changes_during_an_apply_are_coalesced_to_the_latest(sim, core):
    sim.faults.update({"apply_delay": 0.2})
    label(core, H100_IDLE, MIG_CONFIG, "all-1g.10gb")
    wait_for(lambda: mig_state(core, H100_IDLE) == "pending")
    label(core, H100_IDLE, MIG_CONFIG, "all-2g.20gb")
    label(core, H100_IDLE, MIG_CONFIG, "all-3g.40gb")
    assert sim.settle()
    assert mig_state(core, H100_IDLE) == "success"
    assert gpu_allocatable(core, H100_IDLE) == {"nvidia.com/mig-3g.40gb": "16"}


def test_removing_the_label_makes_the_operator_set_all_disabled(sim, core):
    label(core, H100_BALANCED, MIG_CONFIG, None)
    assert sim.settle()
    labels = labels_of(core, H100_BALANCED)
    assert (labels[MIG_CONFIG], labels[MIG_STATE]) == ("all-disabled", "success")
    assert gpu_allocatable(core, H100_BALANCED) == {"nvidia.com/gpu": "8"}


def test_each_mig_capable_node_publishes_its_generated_config(sim, core):
    configmaps = core.list_namespaced_config_map(
        "gpu-operator", label_selector="app.kubernetes.io/component=nvidia-mig-manager"
    ).items
    names = {cm.metadata.name for cm in configmaps}
    assert f"{H100_IDLE}-mig-config" in names and f"{L4}-mig-config" not in names
    generated = next(cm for cm in configmaps if cm.metadata.name == f"{H100_IDLE}-mig-config")
    assert generated.metadata.labels["nvidia.com/node-name"] == H100_IDLE
    configs = yaml.safe_load(generated.data["config.yaml"])["mig-configs"]
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.10gb", "all-1g.10gb.me", "all-7g.80gb"} <= set(
        configs
    )
    assert configs["all-balanced"][0]["mig-devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert configs["all-1g.20gb"][0]["mig-devices"] == {"1g.20gb": 4}


def test_time_slicing_config_multiplies_allocatable(sim, core):
    label(core, L4, PLUGIN_CONFIG, "time-sliced-4")
    assert sim.settle()
    labels = labels_of(core, L4)
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu": "16"}
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"


def set_mig_strategy(custom, strategy: str) -> None:
    """What an admin does to the ClusterPolicy; the operator restarts every device-plugin pod (§1.2)."""
    patch = {"spec": {"mig": {"strategy": strategy}}}
    custom.patch_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy", patch)


def plugin_pod(core, node: str):
    pods = core.list_namespaced_pod(
        "gpu-operator", label_selector="app=nvidia-device-plugin-daemonset", field_selector=f"spec.nodeName={node}"
    ).items
    (pod,) = pods
    return pod


def test_mps_under_the_mixed_strategy_crash_loops_the_device_plugin(sim, core, custom):
    assert custom.get_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy")["spec"]["mig"] == {
        "strategy": "mixed"
    }
    label(core, L4, PLUGIN_CONFIG, "mps-4")  # an L4 has no MIG at all: the flags alone make the plugin exit
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {}
    assert core.read_node(L4).status.allocatable["nvidia.com/gpu"] == "0"
    crashed = {
        s.name: s.state.waiting.reason for s in plugin_pod(core, L4).status.container_statuses if s.state.waiting
    }
    assert crashed == {"nvidia-device-plugin": "CrashLoopBackOff"}
    events = core.list_namespaced_event(
        "gpu-operator", field_selector=f"involvedObject.name={plugin_pod(core, L4).metadata.name}"
    )
    assert any("using --mig-strategy=mixed is not supported with MPS" in e.message for e in events.items)
    assert sim.state(L4)["device_plugin"]["error"] == "using --mig-strategy=mixed is not supported with MPS"
    set_mig_strategy(custom, "single")
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu": "16"}
    labels = labels_of(core, L4)
    assert (labels["nvidia.com/gpu.sharing-strategy"], labels["nvidia.com/mps.capable"]) == ("mps", "true")
    assert all(s.ready for s in plugin_pod(core, L4).status.container_statuses)


def test_an_unset_strategy_leaves_the_config_in_charge(sim, core, custom):
    set_mig_strategy(custom, None)  # merge patch: removes spec.mig.strategy; the operator sets no MIG_STRATEGY
    assert sim.settle()
    label(core, L4, PLUGIN_CONFIG, "mps-4")  # its flags.migStrategy is none
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu": "16"}


def test_rename_by_default_advertises_gpu_shared(sim, core):
    renamed = (
        "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n"
        "      - name: nvidia.com/gpu\n        replicas: 2\n"
    )
    core.patch_namespaced_config_map("device-plugin-config", "gpu-operator", {"data": {"ts-renamed": renamed}})
    label(core, L4, PLUGIN_CONFIG, "ts-renamed")
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu.shared": "8"}
    assert labels_of(core, L4)["nvidia.com/gpu.product"] == "NVIDIA-L4"


def test_unknown_plugin_config_key_breaks_the_plugin_until_fixed(sim, core):
    label(core, L4, PLUGIN_CONFIG, "no-such-key")
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {}
    assert core.read_node(L4).status.allocatable["nvidia.com/gpu"] == "0"
    events = core.list_namespaced_event("gpu-operator").items
    warning = next(e for e in events if e.type == "Warning" and "no-such-key" in e.message)
    plugin_pod = core.read_namespaced_pod(warning.involved_object.name, "gpu-operator")
    assert plugin_pod.spec.node_name == L4
    waiting = [s.state.waiting.reason for s in plugin_pod.status.container_statuses if s.state.waiting]
    assert waiting == ["CrashLoopBackOff"]
    label(core, L4, PLUGIN_CONFIG, "time-sliced-4")
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu": "16"}
    assert all(
        s.ready for s in core.read_namespaced_pod(plugin_pod.metadata.name, "gpu-operator").status.container_statuses
    )


def test_edited_plugin_config_is_not_noticed_until_the_plugin_restarts(sim, core):
    label(core, L4, PLUGIN_CONFIG, "time-sliced-4")
    assert sim.settle()
    eight = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 8\n"
    core.patch_namespaced_config_map("device-plugin-config", "gpu-operator", {"data": {"time-sliced-4": eight}})
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu": "16"}
    control(sim, f"/_sim/nodes/{L4}/restart-device-plugin")
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu": "32"}


def test_mps_on_a_mig_node_breaks_the_plugin(sim, core, custom):
    set_mig_strategy(custom, "single")
    label(core, H100_BALANCED, MIG_CONFIG, "all-1g.10gb")
    label(core, H100_BALANCED, PLUGIN_CONFIG, "mps-4")
    assert sim.settle()
    assert gpu_allocatable(core, H100_BALANCED) == {}
    assert "not supported for MIG" in sim.state(H100_BALANCED)["device_plugin"]["error"]


def test_time_slicing_mig_devices_under_mixed(sim, core):
    shared = (
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - name: nvidia.com/mig-1g.10gb\n        replicas: 3\n"
    )
    core.patch_namespaced_config_map("device-plugin-config", "gpu-operator", {"data": {"mig-shared": shared}})
    label(core, H100_BALANCED, PLUGIN_CONFIG, "mig-shared")
    assert sim.settle()
    allocatable = gpu_allocatable(core, H100_BALANCED)
    assert allocatable["nvidia.com/mig-1g.10gb"] == "48" and allocatable["nvidia.com/mig-3g.40gb"] == "8"
    labels = labels_of(core, H100_BALANCED)
    assert labels["nvidia.com/mig-1g.10gb.replicas"] == "3"
    assert labels["nvidia.com/mig-1g.10gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED"


def test_changing_the_plugin_configmap_in_the_cluster_policy_restarts_plugins(sim, core, custom):
    core.create_namespaced_config_map(
        "gpu-operator",
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="tessera-plugin"),
            data={
                "ts-2": "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n"
            },
        ),
    )
    custom.patch_cluster_custom_object(
        "nvidia.com",
        "v1",
        "clusterpolicies",
        "cluster-policy",
        {"spec": {"devicePlugin": {"config": {"name": "tessera-plugin", "default": "ts-2"}}}},
    )
    assert sim.settle()
    assert gpu_allocatable(core, L4) == {"nvidia.com/gpu": "8"}  # unlabelled: the ClusterPolicy default key


def test_single_strategy_advertises_mig_devices_as_gpus():
    with Simulator(nodes=3, seed=7, apply_delay=0.0, workload_pods=0, mig_strategy="single") as single:
        core = client.CoreV1Api(config.new_client_from_config(config_file=single.kubeconfig_path))
        node = "gpu-node-0002"
        label(core, node, MIG_CONFIG, "all-1g.10gb")
        assert single.settle()
        labels = labels_of(core, node)
        assert gpu_allocatable(core, node) == {"nvidia.com/gpu": "56"}
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
        assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.memory"]) == ("56", "9984")
        label(core, node, MIG_CONFIG, "all-balanced")
        assert single.settle()
        assert labels_of(core, node)["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
        assert gpu_allocatable(core, node) == {}


def test_static_config_tells_products_apart_by_device_filter():
    with Simulator(nodes=3, seed=7, apply_delay=0.0, workload_pods=0, mig_config_source="static") as static:
        core = client.CoreV1Api(config.new_client_from_config(config_file=static.kubeconfig_path))
        a100_40gb, h100 = "gpu-node-0001", "gpu-node-0002"
        assert static.nodes[a100_40gb].product.name == "NVIDIA-A100-SXM4-40GB"
        for node in (a100_40gb, h100):
            label(core, node, MIG_CONFIG, "all-1g.10gb")
        assert static.settle()
        # 1g.10gb is the double-memory 1g on an A100-40GB (4 per GPU) and the base 1g on an H100 (7 per GPU).
        assert gpu_allocatable(core, a100_40gb) == {"nvidia.com/mig-1g.10gb": "32"}
        assert gpu_allocatable(core, h100) == {"nvidia.com/mig-1g.10gb": "56"}


def test_workload_and_readiness_knobs(sim, core):
    reply = control(sim, "/_sim/workload", {"add": 3})
    assert len(reply["added"]) == 3
    namespace, name = reply["added"][0].split("/")
    pod = core.read_namespaced_pod(name, namespace)
    assert pod.status.qos_class in ("Guaranteed", "Burstable", "BestEffort")
    assert any(k.startswith("nvidia.com/") for k in pod.spec.containers[0].resources.limits)
    assert len(control(sim, "/_sim/workload", {"remove": 2})["removed"]) == 2
    control(sim, f"/_sim/nodes/{L4}/ready", {"ready": False})
    node = core.read_node(L4)
    assert next(c.status for c in node.status.conditions if c.type == "Ready") == "Unknown"
    assert {t.key for t in node.spec.taints} == {"node.kubernetes.io/unreachable"}
