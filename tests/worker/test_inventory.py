"""Inventory from the simulator over real HTTPS: the full sync (nodes, GPUs from dcgm-exporter, MIG devices, pods),
idempotence, gone nodes, the watch (resume after a cut stream, re-list after 410 Gone, error bursts, batching),
cluster health, and the watch_clusters supervisor and its lock."""

import threading
import time

import pytest
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet.models import Cluster, Gpu, MigDevice, Node, PendingPod, Pod
from fleet.services import pending_pods_record
from sharing import services as sharing_services
from sharing.qos import qos_class
from simulator.resources import NODES, PODS
from tests.factories import ClusterFactory, NodePoolFactory
from tests.processes import wait_until
from worker import tasks
from worker.drivers import driver_for
from worker.inventory.cluster import cluster_health, scrape_metrics, sync_cluster_full
from worker.inventory.dcgm import WANTED_METRICS, InstanceSample, mig_devices, parse_dcgm
from worker.inventory.pods import pending_observation, pod_observation, sync_pods
from worker.inventory.watch import ClusterWatcher
from worker.locks import ClusterLock
from worker.management.commands.watch_clusters import Supervisor

H100_BALANCED, H100_MIG_BUSY, H100_IDLE, L4, T4 = (
    "gpu-node-0010",
    "gpu-node-0008",
    "gpu-node-0002",
    "gpu-node-0006",
    "gpu-node-0003",
)
MERGE = "application/merge-patch+json"


@pytest.fixture
def sim_options():
    return {"workload_pods": 6, "watch_history": 200}


@pytest.fixture
def adopted(sim, sim_cluster):
    driver_for(sim_cluster).adopt_operator_configs()
    assert sim.settle()
    return sim_cluster


def label(core, node, key, value):
    core.patch_node(node, {"metadata": {"labels": {key: value}}}, _content_type=MERGE)


# --- full sync ----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_full_sync_maps_nodes_from_their_labels(sim, sim_cluster):
    result = sync_cluster_full(sim_cluster)
    assert result.nodes == 12 and result.resource_version.isdigit()
    nodes = {n.name: n for n in Node.objects.filter(cluster=sim_cluster)}
    assert len(nodes) == 12
    balanced = nodes[H100_BALANCED]
    sim_node = sim.nodes[H100_BALANCED]
    assert balanced.ready is True and balanced.unschedulable is False
    assert balanced.kubelet_version == "v1.32.4"
    assert (balanced.driver_version, balanced.cuda_version) == (sim_node.driver_version, sim_node.cuda_version)
    assert (balanced.observed_mode, balanced.observed_mig_config, balanced.config_state) == (
        "mig",
        "all-balanced",
        "success",
    )
    assert balanced.allocatable == {
        "nvidia.com/mig-1g.10gb": 16,
        "nvidia.com/mig-2g.20gb": 8,
        "nvidia.com/mig-3g.40gb": 8,
    }
    assert balanced.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert "nvidia.com/gfd.timestamp" not in balanced.labels  # changes on every GFD pass, means nothing
    assert nodes[H100_IDLE].observed_mode == "passthrough"
    # No MIG Manager on an L4: its state is the device plugin's (advertising GPUs = success).
    assert (nodes[L4].observed_mode, nodes[L4].config_state, nodes[L4].observed_mig_config) == (
        "passthrough",
        "success",
        "",
    )
    sim_cluster.refresh_from_db()
    assert sim_cluster.connection_state == "ok" and sim_cluster.last_contact_at is not None


@pytest.mark.django_db
def test_full_sync_takes_gpus_and_mig_devices_from_dcgm_exporter(sim, sim_cluster):
    sync_cluster_full(sim_cluster)
    assert Gpu.objects.count() == sum(len(n.gpus) for n in sim.nodes.values())
    for sim_gpu in sim.nodes[H100_BALANCED].gpus:
        gpu = Gpu.objects.get(uuid=sim_gpu.uuid)
        assert (gpu.node.name, gpu.index, gpu.pci_bus_id) == (H100_BALANCED, sim_gpu.index, sim_gpu.pci_bus_id)
        assert (gpu.product, gpu.memory_mib, gpu.mig_capable, gpu.mig_enabled) == (
            "NVIDIA-H100-80GB-HBM3",
            81559,
            True,
            True,
        )
        assert gpu.pci_device_id == "0x233010DE"
        stored = list(gpu.mig_devices.order_by("start").values_list("profile", "start", "size", "gpu_instance_id"))
        assert stored == [
            (d.profile, d.start, d.size, d.gi_id) for d in sorted(sim_gpu.mig_devices, key=lambda d: d.start)
        ]
        assert gpu.utilization_pct is not None and gpu.temperature_c and gpu.power_w and gpu.metrics_at
    t4 = Gpu.objects.filter(node__name=T4).first()
    assert (t4.product, t4.mig_capable, t4.mig_enabled, t4.mig_devices.count()) == ("Tesla-T4", False, False, 0)
    # Who uses a MIG device comes from the exporter's pod mapping.
    devices = MigDevice.objects.filter(gpu__node__name=H100_MIG_BUSY).exclude(in_use_by="")
    users = set(devices.values_list("in_use_by", flat=True))
    pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in sim.store.indexed(PODS, H100_MIG_BUSY)}
    assert users and users <= pods


@pytest.mark.django_db
def test_mig_placements_fall_back_to_the_catalog_when_instance_ids_do_not_fit():
    from sharing.mig import get_product

    h100 = get_product("NVIDIA-H100-80GB-HBM3")

    def instances(*rows):
        return [InstanceSample(profile, gi_id, user) for profile, gi_id, user in rows]

    by_id = mig_devices(h100, instances(("3g.40gb", 2, ""), ("1g.10gb", 7, "a/b"), ("2g.20gb", 4, "")))
    assert [(d.profile, d.start, d.size) for d in by_id] == [("1g.10gb", 0, 1), ("2g.20gb", 2, 2), ("3g.40gb", 4, 4)]
    unknown_ids = mig_devices(h100, instances(("3g.40gb", 42, ""), ("1g.10gb", 42, ""), ("1g.10gb", 43, "")))
    assert [(d.profile, d.start) for d in unknown_ids] == [("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)]
    assert mig_devices(h100, instances(("9g.99gb", 1, ""))) == ()


@pytest.mark.django_db
def test_second_sync_changes_nothing(sim, sim_cluster):
    sync_cluster_full(sim_cluster)
    sync_pods(sim_cluster)
    again = sync_cluster_full(sim_cluster)
    assert not again.changed.changed, again.changed
    assert sync_pods(sim_cluster) == 0
    scraped = scrape_metrics(sim_cluster)
    assert not scraped.changed.changed and scraped.metrics_recorded == Gpu.objects.count()


@pytest.mark.django_db
def test_pods_holding_gpus_are_recorded_per_node(sim, sim_cluster):
    sync_cluster_full(sim_cluster, gpus=False)
    assert sync_pods(sim_cluster) == 6
    assert Pod.objects.count() == 6
    pod = Pod.objects.get(node__name="gpu-node-0001")
    assert (pod.namespace, pod.name, pod.phase) == ("ml-training", "train-bk4tn4-g5f5p", "Running")
    assert pod.gpu_resources == {"nvidia.com/gpu": 2}
    assert (pod.owner_kind, pod.priority_class) == ("Job", "batch-low")
    assert pod.qos_class in ("Guaranteed", "Burstable", "BestEffort") and pod.uid
    assert pod.spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # The stored spec keeps what the QoS rules read: computing the class from it gives the API server's answer.
    assert {p.name: qos_class(p.spec) for p in Pod.objects.all()} == {p.name: p.qos_class for p in Pod.objects.all()}
    removed = sim.remove_workload(6)
    assert len(removed) == 6
    sync_pods(sim_cluster)
    assert Pod.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("sim_options", [{"workload_pods": 6}])
def test_running_pods_keep_their_labels_and_when_they_were_created_and_scheduled(sim, sim_cluster):
    sync_cluster_full(sim_cluster, gpus=False)
    sync_pods(sim_cluster)
    pod = Pod.objects.first()
    assert pod.labels and pod.created_at is not None and pod.scheduled_at is not None
    assert pod.scheduled_at >= pod.created_at


@pytest.mark.django_db
def test_pods_waiting_for_a_gpu_are_recorded_per_cluster_and_replaced_by_each_listing(sim_cluster):
    def pod(name, *, node="", phase="Pending", limits=None):
        return {
            "metadata": {"namespace": "ml", "name": name, "uid": name, "labels": {"team": "vision"},
                         "creationTimestamp": "2025-03-04T09:58:00Z"},
            "spec": {"nodeName": node, "nodeSelector": {"pool": "serve"},
                     "containers": [{"name": "m", "resources": {"limits": limits or {"nvidia.com/mig-3g.40gb": "1"}}}]},
            "status": {"phase": phase},
        }  # fmt: skip

    waiting = pending_observation(pod("wants-a-slice"))
    assert (waiting.namespace, waiting.labels, waiting.node_selector) == ("ml", {"team": "vision"}, {"pool": "serve"})
    assert waiting.gpu_resources == {"nvidia.com/mig-3g.40gb": 1}
    assert waiting.created_at.isoformat() == "2025-03-04T09:58:00+00:00"
    assert pending_observation(pod("placed", node="gpu-node-0001")) is None
    assert pending_observation(pod("no-gpu", limits={"cpu": "1"})) is None
    assert pending_observation(pod("done", phase="Succeeded")) is None
    pending_pods_record(cluster=sim_cluster, pods=[waiting])
    pending_pods_record(cluster=sim_cluster, pods=[waiting])
    assert list(PendingPod.objects.values_list("name", flat=True)) == ["wants-a-slice"]
    pending_pods_record(cluster=sim_cluster, pods=[])
    assert not PendingPod.objects.exists()


def test_the_stored_spec_keeps_pod_level_resources():
    # Pod-level resources decide the QoS class (PodLevelResources): without them, bare containers read as BestEffort.
    limits = {"cpu": "2", "memory": "2Gi"}
    pod = {
        "metadata": {"namespace": "ml", "name": "p"},
        "spec": {
            "resources": {"requests": dict(limits), "limits": limits, "claims": []},
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"qosClass": "Guaranteed"},
    }
    observed = pod_observation(pod)
    assert observed.spec == {
        "resources": {"requests": limits, "limits": limits},
        "containers": [{"name": "main", "resources": {"requests": {}, "limits": {"nvidia.com/gpu": "1"}}}],
        "tolerations": [],
    }
    assert qos_class(observed.spec) == observed.qos_class == "Guaranteed"
    del pod["spec"]["resources"]
    assert "resources" not in pod_observation(pod).spec


@pytest.mark.django_db
def test_a_node_deleted_from_the_cluster_is_marked_gone_by_the_complete_sync(sim, sim_cluster):
    sync_cluster_full(sim_cluster)
    # The simulated API serves no DELETE on nodes; the cluster losing a node is done on its store.
    sim.store.delete(NODES, "", T4)
    result = sync_cluster_full(sim_cluster)
    assert result.changed.nodes_gone == 1
    gone = Node.objects.get(name=T4)
    assert gone.gone_at is not None
    assert not Gpu.objects.filter(node=gone, gone_at__isnull=True).exists()


@pytest.mark.django_db
def test_scrape_records_utilisation_and_health(sim, sim_cluster):
    sync_cluster_full(sim_cluster, gpus=False)
    assert Gpu.objects.count() == 0  # GPUs only exist once the exporter has been read
    sim.faults.update({"xid": {H100_IDLE: {"3": 79}}})
    result = scrape_metrics(sim_cluster)
    assert result.gpus == Gpu.objects.count() > 0
    sick = Gpu.objects.get(node__name=H100_IDLE, index=3)
    assert (sick.last_xid, sick.health) == (79, "unhealthy")
    assert Gpu.objects.filter(node__name=H100_IDLE, index=2, health="healthy").exists()


def test_lean_parser_reads_what_prometheus_client_reads(sim):
    text = sim.metrics_text(H100_BALANCED) + sim.metrics_text(H100_IDLE)
    lean = parse_dcgm(text.splitlines())
    reference, instances = {}, {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")  # prometheus_client appends _total to counter samples
            if name not in WANTED_METRICS:
                continue
            key = (sample.labels["hostname"], int(sample.labels["gpu"]))
            if "GPU_I_ID" in sample.labels and name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
                instances.setdefault((*key, int(sample.labels["GPU_I_ID"])), {})[name] = sample.value
            elif "GPU_I_ID" not in sample.labels or name != "DCGM_FI_DEV_FB_FREE":
                reference.setdefault(key, {})[name] = sample.value
    ours = {(host, index): g.values for host, gpus in lean.items() for index, g in gpus.items()}
    assert ours == reference
    ours = {
        (host, index, gi): {k: v for k, v in i.values.items() if k != "DCGM_FI_DEV_FB_FREE"}
        for host, gpus in lean.items()
        for index, g in gpus.items()
        for gi, i in g.instances.items()
    }
    assert ours == instances and len(instances) == 8 * 4
    assert not any(g.instances for g in lean[H100_IDLE].values())


# --- health -------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_health_says_plainly_when_the_cluster_policy_is_not_tesseras(sim, sim_cluster):
    report = cluster_health(sim_cluster)
    assert [name for name, ok, _ in report.checks if not ok] == ["mig_configmap", "device_plugin_configmap"]
    sim_cluster.refresh_from_db()
    assert sim_cluster.connection_state == "error"
    assert sim_cluster.last_error.startswith(
        "ClusterPolicy cluster-policy uses the GPU Operator's generated MIG configs"
    )
    assert "GPU Operator >= v26.3" in sim_cluster.last_error
    driver_for(sim_cluster).adopt_operator_configs()
    assert cluster_health(sim_cluster).ok
    sim_cluster.refresh_from_db()
    assert (sim_cluster.connection_state, sim_cluster.last_error) == ("ok", "")


@pytest.mark.django_db
def test_health_stores_the_cluster_policys_mig_strategy_and_plugin_version(sim, sim_cluster):
    assert sim_cluster.cluster_policy_read_at is None
    cluster_health(sim_cluster, record=False)  # the watcher's call: the policy is stored all the same
    sim_cluster.refresh_from_db()
    assert (sim_cluster.mig_strategy, sim_cluster.device_plugin_version) == ("mixed", "v0.20.0")
    assert sim_cluster.cluster_policy_read_at is not None and sim_cluster.mps_honours_fail_false is True
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        patch = {"spec": {"mig": {"strategy": None}, "devicePlugin": {"version": None}}}
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            "nvidia.com", "v1", "clusterpolicies", "cluster-policy", patch, _content_type=MERGE
        )
    cluster_health(sim_cluster)
    sim_cluster.refresh_from_db()
    # Not set: each node's config decides; no version in the policy: the tag of the DaemonSet's plugin container.
    assert (sim_cluster.mig_strategy, sim_cluster.device_plugin_version) == ("", "v0.20.0")


@pytest.mark.django_db
def test_mps_is_refused_while_the_cluster_policy_says_mixed(sim, sim_cluster, admin_user):
    actor = Actor.for_user(admin_user)
    sync_cluster_full(sim_cluster, metrics=False)
    pool = NodePoolFactory(cluster=sim_cluster)
    Node.objects.filter(name=L4).update(pool=pool)
    product = Gpu.objects.filter(node__name=L4).values_list("product", flat=True).first()
    mps = sharing_services.profile_create(actor=actor, name="mps-4", mode="mps", target_products=[product], replicas=4)
    cluster_health(sim_cluster)
    with pytest.raises(ApplicationError) as refused:
        sharing_services.pool_set_profile(actor=actor, pool=pool, profile=mps)
    assert "cluster sim's ClusterPolicy sets spec.mig.strategy=mixed" in refused.value.message
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        patch = {"spec": {"mig": {"strategy": "single"}}}
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            "nvidia.com", "v1", "clusterpolicies", "cluster-policy", patch, _content_type=MERGE
        )
    cluster_health(sim_cluster)
    assert sharing_services.pool_set_profile(actor=actor, pool=pool, profile=mps).profile == mps


@pytest.mark.django_db
def test_health_of_an_unreachable_cluster(sim, sim_cluster):
    driver_for(sim_cluster)  # the client is built (and cached) while the kubeconfig still exists
    sim.stop()
    report = cluster_health(sim_cluster)
    assert not report.reachable and report.problem.startswith("Kubernetes API of cluster sim: API server unreachable")
    sim_cluster.refresh_from_db()
    assert sim_cluster.connection_state == "error" and sim_cluster.last_contact_at is None and sim_cluster.last_error_at


@pytest.mark.django_db
def test_inventory_tasks_of_an_unreachable_cluster_log_one_line_and_return(sim, sim_cluster, caplog):
    """The next tick tries again and the health check shows the state: no failed task, no traceback in the log."""
    sync_cluster_full(sim_cluster)
    assert Node.objects.live().filter(cluster=sim_cluster, ready=True).exists()  # so the scrape reads the endpoint
    sim.stop()
    assert tasks.cluster_scrape_metrics(sim_cluster.pk) == {"gpus": 0}
    assert tasks.cluster_sync_pods(sim_cluster.pk) == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "worker.tasks"]
    skipped = [w.split(":")[1].strip() for w in warnings]
    assert skipped == ["metrics scrape skipped this round", "pod sync skipped this round"]
    assert all("unreachable" in w for w in warnings) and not any(r.exc_info for r in caplog.records)


@pytest.mark.django_db
def test_inventory_tasks_of_a_cluster_whose_kubeconfig_is_gone_log_one_line_and_return(caplog, settings):
    """A restarting simulator rewrites its kubeconfig (make run), an admin may replace one: the same kind of state."""
    lost = ClusterFactory(
        name="lost", driver="kubernetes", kubeconfig_path=f"{settings.TESSERA['KUBECONFIG_DIR']}/gone"
    )
    assert tasks.cluster_sync_pods(lost.pk) == 0
    (warning,) = [r for r in caplog.records if r.name == "worker.tasks"]
    assert warning.getMessage().startswith("cluster lost: pod sync skipped this round: cannot load the kubeconfig")
    assert not warning.exc_info


# --- watch ---------------------------------------------------------------------------------------------------------


class Running:
    """A ClusterWatcher on a thread, stopped at the end of the test."""

    def __init__(self, cluster, **options):
        self.watcher = ClusterWatcher(cluster, **{"batch_seconds": 0.2, "watch_seconds": 30, **options})
        self.thread = threading.Thread(target=self.watcher.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_until(lambda: self.watcher.stats.streams >= 1, timeout=20, message="the watch to start")
        return self.watcher

    def __exit__(self, *exc):
        self.watcher.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


def node_label(name, key):
    return Node.objects.get(name=name).labels.get(key)


@pytest.mark.django_db(transaction=True)
def test_watch_records_changes_in_batches_proportional_to_changed_nodes(sim, core, adopted):
    with Running(adopted, gpus_on_start=False) as watcher:
        names = [f"gpu-node-{i:04d}" for i in range(1, 11)]
        for name in names:
            label(core, name, "tessera.io/pool", "inference")
        wait_until(lambda: all(node_label(n, "tessera.io/pool") == "inference" for n in names), timeout=10,
                   message="all ten nodes recorded")  # fmt: skip
        assert watcher.stats.lists == 1
        assert watcher.stats.batches <= 3  # ten changes in a burst: one or two recordings, not ten
    cluster = Cluster.objects.get(pk=adopted.pk)
    assert cluster.connection_state == "ok" and cluster.last_contact_at is not None


@pytest.mark.django_db(transaction=True)
def test_watch_resumes_from_its_resource_version_after_a_dropped_stream(sim, core, adopted):
    sim.faults.update({"watch_drop_after_events": 2})
    with Running(adopted, gpus_on_start=False) as watcher:
        names = [f"gpu-node-{i:04d}" for i in range(1, 8)]
        for name in names:
            label(core, name, "tessera.io/rack", "r1")
            time.sleep(0.05)
        wait_until(lambda: all(node_label(n, "tessera.io/rack") == "r1" for n in names), timeout=15,
                   message="changes across cut streams")  # fmt: skip
        assert watcher.stats.disconnects >= 2
        assert (watcher.stats.lists, watcher.stats.gone, watcher.stats.errors) == (1, 0, 0)  # resumed, no re-list


@pytest.mark.django_db(transaction=True)
def test_watch_relists_after_410_gone(sim, core, adopted):
    sync_cluster_full(adopted, gpus=False)
    watcher = ClusterWatcher(adopted, batch_seconds=0.2, watch_seconds=30, gpus_on_start=False)
    watcher.version = str(sim.store.resource_version)  # as if resuming after a long outage from this version
    label(core, H100_IDLE, "tessera.io/pool", "training")
    sim.add_workload(150)
    sim.remove_workload(150)  # more changes than the server keeps (watch_history=200): the version is too old
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: node_label(H100_IDLE, "tessera.io/pool") == "training", timeout=15, message="re-list")
        assert watcher.stats.gone == 1 and watcher.stats.lists == 1
        label(core, H100_IDLE, "tessera.io/pool", "serving")
        wait_until(lambda: node_label(H100_IDLE, "tessera.io/pool") == "serving", timeout=10, message="watching")
    finally:
        watcher.stop()
        thread.join(10)


@pytest.mark.django_db(transaction=True)
def test_watch_survives_an_error_burst_and_records_connection_health(sim, core, adopted):
    with Running(adopted, gpus_on_start=False, watch_seconds=1) as watcher:
        sim.faults.update({"error_rate": 1.0, "watch_drop_after_events": 1})
        # The cluster changes while every API request fails (written on the simulator's store, not through the API).
        sim.store.mutate(NODES, "", H100_IDLE, lambda node: node["metadata"]["labels"].update({"tessera.io/pool": "x"}))
        wait_until(lambda: Cluster.objects.get(pk=adopted.pk).connection_state == "error", timeout=15,
                   message="the error recorded")  # fmt: skip
        cluster = Cluster.objects.get(pk=adopted.pk)
        assert cluster.last_error.startswith("sim: ") and cluster.last_error_at
        assert watcher.stats.errors >= 1
        sim.faults.update({"error_rate": 0.0, "watch_drop_after_events": 0})
        wait_until(lambda: node_label(H100_IDLE, "tessera.io/pool") == "x", timeout=40, message="recovery")
        wait_until(lambda: Cluster.objects.get(pk=adopted.pk).connection_state == "ok", timeout=15, message="ok again")
        label(core, H100_IDLE, "tessera.io/pool", "y")
        wait_until(lambda: node_label(H100_IDLE, "tessera.io/pool") == "y", timeout=10, message="watching again")


@pytest.mark.django_db(transaction=True)
def test_watch_marks_a_deleted_node_gone(sim, adopted):
    with Running(adopted, gpus_on_start=False) as watcher:
        sim.store.delete(NODES, "", T4)  # no DELETE on nodes in the simulated API; the cluster loses it here
        wait_until(lambda: Node.objects.get(name=T4).gone_at is not None, timeout=10, message="gone")
        assert watcher.stats.lists == 2


# --- watch_clusters -----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_cluster_lock_allows_one_holder():
    first, second = ClusterLock(41), ClusterLock(41)
    assert first.acquire() and first.alive()
    assert not second.acquire()
    assert ClusterLock(42).acquire()
    first.release()
    assert second.acquire()
    second.release()


@pytest.mark.django_db(transaction=True)
def test_supervisor_starts_stops_and_never_doubles_watchers(sim, adopted):
    supervisor = Supervisor(watcher_options={"gpus_on_start": False, "batch_seconds": 0.2, "watch_seconds": 30})
    other = Supervisor()
    try:
        supervisor.rescan()
        assert list(supervisor.watchers()) == [adopted.pk]
        other.rescan()
        assert other.watchers() == {}  # the first process holds the cluster's lock
        wait_until(lambda: Node.objects.filter(cluster=adopted).count() == 12, timeout=15, message="first list")
        Cluster.objects.filter(pk=adopted.pk).update(driver="agent")
        supervisor.rescan()
        assert supervisor.watchers() == {}
        Cluster.objects.filter(pk=adopted.pk).update(driver="kubernetes")
        other.rescan()
        assert list(other.watchers()) == [adopted.pk]  # the lock was released with the watcher
    finally:
        supervisor.stop_all()
        other.stop_all()


@pytest.mark.django_db(transaction=True)
def test_watch_clusters_command_watches_and_stops_cleanly_on_sigterm(sim, adopted, tmp_path):
    import signal
    import subprocess
    import sys

    from tests.processes import ROOT, child_env

    log = tmp_path / "watch_clusters.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "watch_clusters", "--rescan", "1"],
            cwd=ROOT,
            env=child_env(tmp_path, "memory://"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: Node.objects.filter(cluster=adopted).count() == 12, timeout=30, message="the first list")
            assert not ClusterLock(adopted.pk).acquire()  # the command holds the cluster's lock
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    assert proc.returncode == 0, log.read_text()[-2000:]
    assert "watch_clusters: stopped" in log.read_text()
    lock = ClusterLock(adopted.pk)
    assert lock.acquire()  # released with the process
    lock.release()
