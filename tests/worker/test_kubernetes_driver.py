"""The Kubernetes driver against the simulator over real HTTPS with the official client (never a mocked client):
ConfigMaps and the ClusterPolicy, label merge patches the MIG Manager acts on, reads, busy pods, cordon,
eviction with PodDisruptionBudget refusals, the wedged-pending restart, and retries through injected errors."""

import gc
import threading

import pytest
import yaml
from kubernetes import client

from fleet.models import Cluster
from sharing.render import DevicePluginSpec, MigDeviceSpec, render_device_plugin_config, render_mig_parted_config
from simulator.resources import PODS
from tests.factories import ClusterFactory
from worker.drivers import driver_for
from worker.drivers.base import BusyPod, DriverError, NodeTarget
from worker.drivers.kubernetes import driver as driver_module
from worker.drivers.kubernetes.api import gc_paused, with_retries

pytestmark = pytest.mark.django_db
H100_IDLE, H100_IDLE_2, H100_BALANCED, A100_BUSY, H100_MIG_BUSY, T4 = (
    "gpu-node-0002",
    "gpu-node-0005",
    "gpu-node-0010",
    "gpu-node-0001",
    "gpu-node-0008",
    "gpu-node-0003",
)
MIG_7 = "tessera-mig-test7"
PLUGIN_MIXED = "tessera-dp-mixed"


def mig_text(name: str, devices: dict | None = None) -> str:
    spec = MigDeviceSpec("all", True, devices or {"1g.10gb": 7}) if devices != {} else MigDeviceSpec("all", False)
    return render_mig_parted_config({name: [spec]})


PLUGIN_MIXED_TEXT = render_device_plugin_config(DevicePluginSpec(mig_strategy="mixed"))


@pytest.fixture
def sim_options():
    return {"workload_pods": 6}


@pytest.fixture
def driver(sim_cluster):
    return driver_for(sim_cluster)


@pytest.fixture
def adopted(sim, driver):
    """The ClusterPolicy pointed at Tessera's ConfigMaps, as `make run` does once."""
    driver.adopt_operator_configs()
    assert sim.settle()
    return driver


def ensure_both(driver):
    """The two configs of a 7×1g.10gb profile: a MIG config and a mixed-strategy plugin config."""
    driver.ensure_configs(mig_configs={MIG_7: mig_text(MIG_7)}, device_plugin_configs={PLUGIN_MIXED: PLUGIN_MIXED_TEXT})


def mig_manager_pods(core) -> set[str]:
    return {
        p.metadata.name for p in core.list_namespaced_pod("gpu-operator", label_selector="app=nvidia-mig-manager").items
    }


def configmap(core, name):
    return core.read_namespaced_config_map(name, "gpu-operator")


def labels(core, node):
    return core.read_node(node).metadata.labels


def test_fixture_fleet_is_as_expected(sim):
    assert sim.nodes[H100_IDLE].product.name == "NVIDIA-H100-80GB-HBM3"
    assert sim.node(H100_BALANCED)["metadata"]["labels"]["nvidia.com/mig.config"] == "all-balanced"
    assert not sim.nodes[T4].product.mig_capable
    assert sim.find_nodes(mig_capable=True, idle=True)[:2] == [H100_IDLE, "gpu-node-0004"]


def test_ensure_configs_refuses_a_cluster_policy_on_generated_configs_and_writes_nothing(
    sim, core, sim_cluster, driver
):
    before = {cm.metadata.name for cm in core.list_namespaced_config_map("gpu-operator").items}
    with pytest.raises(DriverError) as caught:
        driver.ensure_configs(mig_configs={MIG_7: mig_text(MIG_7)}, device_plugin_configs={})
    assert not caught.value.transient
    assert str(caught.value).startswith(
        "ClusterPolicy cluster-policy uses the GPU Operator's generated MIG configs; set "
        "spec.migManager.config.name to a ConfigMap Tessera manages, e.g. tessera-mig-parted-config"
    )
    assert {cm.metadata.name for cm in core.list_namespaced_config_map("gpu-operator").items} == before
    sim_cluster.refresh_from_db()
    assert sim_cluster.connection_state == "error"
    assert "generated MIG configs" in sim_cluster.last_error
    assert sim_cluster.last_contact_at is not None  # the API answered: a configuration problem, not an outage


def test_ensure_configs_refuses_a_plugin_configmap_tessera_does_not_manage(driver):
    with pytest.raises(DriverError, match="device-plugin-config .* is not managed by Tessera"):
        driver.ensure_configs(mig_configs={}, device_plugin_configs={PLUGIN_MIXED: PLUGIN_MIXED_TEXT})


def test_adoption_carries_every_config_in_use_over_and_no_node_fails(sim, core, adopted):
    policy = client.CustomObjectsApi(core.api_client).get_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
    )
    assert policy["spec"]["migManager"]["config"]["name"] == "tessera-mig-parted-config"
    assert policy["spec"]["devicePlugin"]["config"]["name"] == "tessera-device-plugin-config"
    mig = configmap(core, "tessera-mig-parted-config")
    assert mig.metadata.labels["app.kubernetes.io/managed-by"] == "tessera"
    names = set(yaml.safe_load(mig.data["config.yaml"])["mig-configs"])
    assert {"all-disabled", "all-balanced", "all-1g.10gb"} <= names
    assert set(configmap(core, "tessera-device-plugin-config").data) == {"default", "time-sliced-4", "mps-4"}
    # Re-pointing restarted every mig-manager; each re-read its label and found its config.
    assert sim.state()["mig_config_states"] == {"success": 9, "none": 3}
    assert adopted.health().ok
    assert adopted.adopt_operator_configs() == ["ClusterPolicy cluster-policy already points at Tessera's ConfigMaps"]


def test_ensure_configs_adds_missing_keys_once_and_never_changes_existing_ones(core, adopted):
    balanced_before = yaml.safe_load(configmap(core, "tessera-mig-parted-config").data["config.yaml"])["mig-configs"][
        "all-balanced"
    ]
    ensure_both(adopted)
    mig = configmap(core, "tessera-mig-parted-config")
    configs = yaml.safe_load(mig.data["config.yaml"])["mig-configs"]
    assert configs[MIG_7] == [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
    assert configs["all-balanced"] == balanced_before
    assert configmap(core, "tessera-device-plugin-config").data[PLUGIN_MIXED] == PLUGIN_MIXED_TEXT

    version = mig.metadata.resource_version
    ensure_both(adopted)
    assert configmap(core, "tessera-mig-parted-config").metadata.resource_version == version  # nothing to write

    with pytest.raises(DriverError, match="already exists with other content"):
        adopted.ensure_configs(mig_configs={MIG_7: mig_text(MIG_7, {"7g.80gb": 1})}, device_plugin_configs={})
    with pytest.raises(DriverError, match="device-plugin config tessera-dp-bad is invalid"):
        adopted.ensure_configs(mig_configs={}, device_plugin_configs={"tessera-dp-bad": "version: v2\n"})
    assert "tessera-dp-bad" not in configmap(core, "tessera-device-plugin-config").data


def test_ensure_configs_creates_a_missing_managed_configmap(core, adopted):
    core.delete_namespaced_config_map("tessera-device-plugin-config", "gpu-operator")
    adopted.ensure_configs(mig_configs={}, device_plugin_configs={PLUGIN_MIXED: PLUGIN_MIXED_TEXT})
    created = configmap(core, "tessera-device-plugin-config")
    assert created.data == {PLUGIN_MIXED: PLUGIN_MIXED_TEXT}
    assert created.metadata.labels == {"app.kubernetes.io/managed-by": "tessera"}


def test_ensure_configs_rereads_and_retries_on_conflicts(sim, core, adopted):
    sim.faults.update({"write_error_rate": 0.6, "error_codes": [409]})
    ensure_both(adopted)
    sim.faults.update({"write_error_rate": 0.0})
    assert MIG_7 in yaml.safe_load(configmap(core, "tessera-mig-parted-config").data["config.yaml"])["mig-configs"]


def test_apply_merge_patches_labels_and_the_mig_manager_reaches_success(sim, core, adopted):
    ensure_both(adopted)
    before = labels(core, H100_IDLE)
    assert adopted.apply([NodeTarget(H100_IDLE, MIG_7, PLUGIN_MIXED), NodeTarget("gpu-node-9999", MIG_7, "x")]) == {
        "gpu-node-9999": "node not found"
    }
    assert sim.settle()
    after = labels(core, H100_IDLE)
    assert after["nvidia.com/mig.config"] == MIG_7
    assert after["nvidia.com/device-plugin.config"] == PLUGIN_MIXED
    assert after["tessera.io/managed"] == "true"
    assert after["kubernetes.io/hostname"] == before["kubernetes.io/hostname"]  # a merge patch, not a replace

    state = adopted.read([H100_IDLE, "gpu-node-9999"])
    assert state[H100_IDLE].mig_config == MIG_7
    assert state[H100_IDLE].mig_state == "success"
    assert state[H100_IDLE].device_plugin_config == PLUGIN_MIXED
    assert {k: v for k, v in state[H100_IDLE].allocatable.items() if v} == {"nvidia.com/mig-1g.10gb": 56}
    assert state["gpu-node-9999"].exists is False


def test_read_by_list_equals_read_by_get(sim, adopted, monkeypatch):
    names = [H100_IDLE, H100_BALANCED, T4, "gpu-node-9999"]
    by_get = adopted.read(names)
    monkeypatch.setattr(driver_module, "LIST_THRESHOLD", 0)
    assert adopted.read(names) == by_get
    assert by_get[H100_BALANCED].mig_config == "all-balanced"
    assert by_get[T4].mig_state == "unknown"  # no MIG Manager on a T4


def test_an_empty_plugin_key_removes_the_label(sim, core, adopted):
    adopted.apply([NodeTarget(T4, None, "time-sliced-4")])
    assert labels(core, T4)["nvidia.com/device-plugin.config"] == "time-sliced-4"
    adopted.apply([NodeTarget(T4, None, "")])
    assert "nvidia.com/device-plugin.config" not in labels(core, T4)
    assert "nvidia.com/mig.config" not in labels(core, T4)  # never set on a node without MIG


def test_busy_pods_are_the_live_gpu_holding_user_pods(sim, adopted, monkeypatch):
    busy = adopted.busy_pods([A100_BUSY, H100_MIG_BUSY, H100_IDLE])
    assert set(busy) == {A100_BUSY, H100_MIG_BUSY}  # the operator's DaemonSet pods never count
    assert busy[A100_BUSY] == [BusyPod("ml-training", "train-bk4tn4-g5f5p", {"nvidia.com/gpu": 2})]
    assert [p.gpu_resources for p in busy[H100_MIG_BUSY]] == [{"nvidia.com/mig-1g.10gb": 1}] * 3
    finished = sim.add_pod(H100_IDLE, "nvidia.com/gpu", 1, namespace="research", controller="Job")
    sim.store.mutate(PODS, "research", finished["metadata"]["name"], lambda p: p["status"].update(phase="Succeeded"))
    assert adopted.busy_pods([H100_IDLE]) == {}  # a Succeeded pod holds nothing
    monkeypatch.setattr(driver_module, "LIST_THRESHOLD", 0)  # many nodes: cluster-wide lists instead of per node
    assert adopted.busy_pods([A100_BUSY, H100_MIG_BUSY, H100_IDLE]) == busy
    # A GPU job in the operator's namespace is not one of its DaemonSet pods: it counts on both paths.
    job = sim.add_pod(H100_IDLE, "nvidia.com/gpu", 1, namespace="gpu-operator", controller="Job")
    expected = [BusyPod("gpu-operator", job["metadata"]["name"], {"nvidia.com/gpu": 1})]
    assert adopted.busy_pods([H100_IDLE, A100_BUSY])[H100_IDLE] == expected
    monkeypatch.setattr(driver_module, "LIST_THRESHOLD", 200)
    assert adopted.busy_pods([H100_IDLE])[H100_IDLE] == expected


def test_cordon_and_uncordon(core, adopted):
    assert adopted.set_cordon([H100_IDLE, H100_IDLE_2], True) == {}
    node = core.read_node(H100_IDLE)
    assert node.spec.unschedulable is True
    assert any(t.key == "node.kubernetes.io/unschedulable" for t in node.spec.taints or [])
    assert adopted.read([H100_IDLE])[H100_IDLE].unschedulable
    assert adopted.set_cordon([H100_IDLE, H100_IDLE_2], False) == {}
    assert not core.read_node(H100_IDLE).spec.unschedulable
    assert adopted.set_cordon(["gpu-node-9999"], True) == {"gpu-node-9999": "node not found"}


def test_evict_honours_disruption_budgets_and_ignores_pods_already_gone(sim, core, adopted):
    free = sim.add_pod(H100_IDLE, "nvidia.com/gpu", 1, namespace="inference", controller="ReplicaSet")
    guarded = sim.add_pod(H100_IDLE, "nvidia.com/gpu", 1, namespace="inference", protected=True)
    pods = [BusyPod("inference", p["metadata"]["name"]) for p in (free, guarded)] + [BusyPod("inference", "gone")]
    refused = adopted.evict({H100_IDLE: pods})
    name = guarded["metadata"]["name"]
    assert refused == {H100_IDLE: [f"eviction of inference/{name} refused (PodDisruptionBudget), retrying"]}
    remaining = {p.metadata.name for p in core.list_namespaced_pod("inference").items}
    assert free["metadata"]["name"] not in remaining and name in remaining
    # A budget that allows it later: the next step's eviction goes through.
    sim.faults.update({"refuse_eviction": {f"inference/{name}": 1}})
    sim.store.mutate(PODS, "inference", name, lambda p: p["metadata"]["labels"].pop("sim.tessera.io/protected"))
    assert adopted.evict({H100_IDLE: [BusyPod("inference", name)]}) == {
        H100_IDLE: [f"eviction of inference/{name} refused (PodDisruptionBudget), retrying"]
    }
    assert adopted.evict({H100_IDLE: [BusyPod("inference", name)]}) == {}
    assert adopted.busy_pods([H100_IDLE]) == {}


def test_restart_config_manager_unwedges_a_pending_node(sim, core, adopted):
    adopted.ensure_configs(mig_configs={MIG_7: mig_text(MIG_7)}, device_plugin_configs={})
    sim.faults.update({"wedge": {H100_IDLE: 1}})
    adopted.apply([NodeTarget(H100_IDLE, MIG_7, "")])
    assert sim.settle()
    assert adopted.read([H100_IDLE])[H100_IDLE].mig_state == "pending"
    old = mig_manager_pods(core)
    adopted.restart_config_manager(H100_IDLE)
    assert sim.settle()
    assert adopted.read([H100_IDLE])[H100_IDLE].mig_state == "success"
    new = mig_manager_pods(core)
    assert len(old - new) == 1 and len(new - old) == 1  # exactly that node's pod was replaced
    with pytest.raises(DriverError, match="no nvidia-mig-manager pod"):
        adopted.restart_config_manager(T4)


def test_every_call_gets_through_bursts_of_injected_errors(sim, core, adopted):
    sim.faults.update({"error_rate": 0.3, "write_error_rate": 0.2, "error_codes": [500, 503, 429, 409]})
    ensure_both(adopted)
    targets = [NodeTarget(n, MIG_7, PLUGIN_MIXED) for n in (H100_IDLE, H100_IDLE_2, "gpu-node-0004")]
    assert adopted.apply(targets) == {}
    assert adopted.set_cordon([T4], True) == {}
    assert set(adopted.busy_pods([A100_BUSY, H100_IDLE])) == {A100_BUSY}
    assert sim.settle()
    states = adopted.read([t.node_name for t in targets])
    sim.faults.update({"error_rate": 0.0, "write_error_rate": 0.0})
    assert {s.mig_state for s in states.values()} == {"success"}


def test_retry_helper_backs_off_then_gives_up_on_permanent_errors():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise client.ApiException(status=503)
        return "ok"

    assert with_retries(flaky, sleep=sleeps.append) == "ok"
    assert len(sleeps) == 2 and all(0 <= s <= 2.0 for s in sleeps)
    with pytest.raises(client.ApiException):
        with_retries(lambda: (_ for _ in ()).throw(client.ApiException(status=403)), sleep=sleeps.append)
    assert len(sleeps) == 2  # a 403 is not retried


def test_credentials_never_appear_in_errors(db, tmp_path):
    secret_path = tmp_path / "very-secret-dir" / "kubeconfig"
    secret_path.parent.mkdir()
    secret_path.write_text("apiVersion: v1\nkind: Config\nusers: [{name: u, user: {token: s3cr3t-token}}]\n")
    cluster = ClusterFactory(kubeconfig_path=str(secret_path))
    with pytest.raises(DriverError) as caught:
        driver_for(cluster)
    text = str(caught.value)
    assert "very-secret-dir" not in text and "s3cr3t" not in text
    assert text.startswith(f"cannot load the kubeconfig credentials of cluster {cluster.name}")


def test_unreachable_api_is_a_transient_error_without_the_address_of_the_credentials(sim, sim_cluster, driver):
    sim.stop()
    with pytest.raises(DriverError) as caught:
        driver.ensure_configs(mig_configs={MIG_7: mig_text(MIG_7)}, device_plugin_configs={})
    assert caught.value.transient
    assert sim.kubeconfig_path not in str(caught.value)
    assert Cluster.objects.get(pk=sim_cluster.pk).connection_state == "error"


def test_gc_paused_while_any_thread_parses_and_restored_as_it_was():
    inside, release = threading.Event(), threading.Event()

    def parse():
        with gc_paused():
            inside.set()
            release.wait(5)

    other = threading.Thread(target=parse)
    other.start()
    inside.wait(5)
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread still parses
    release.set()
    other.join()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # someone else's choice stands
    finally:
        gc.enable()
