"""The rollout engine with the REAL Kubernetes driver against the simulator (issue 5 item 6): a profile assigned,
reconciled and rolled out to every node; a failed apply rolled back; a wedged `pending` retried under a new name;
busy GPUs under each policy; 20 % API errors; a Celery worker SIGKILLed mid-rollout; the broker down for a while.

Most tests drive the engine in-process (the services the tasks call, in a loop, as test_engine.py does); the
last two run real Celery worker processes on the filesystem broker against the same test database.
"""

import signal
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone
from kombu import Connection
from kubernetes import client

from config.celery import app
from core.audit import Actor
from core.models import AuditEvent
from fleet.models import Node, NodePool
from sharing import services as sharing_services
from tests.processes import celery_worker, kill_tree, wait_until
from worker import reconcile, services
from worker.choices import IN_FLIGHT_STATUSES
from worker.drivers import driver_for
from worker.inventory.cluster import sync_cluster_full
from worker.models import NodeChange, Rollout
from worker.tasks import node_changes_step, rollout_advance

pytestmark = [pytest.mark.services, pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")]
H100 = "NVIDIA-H100-80GB-HBM3"
POOL_NODES = ("gpu-node-0002", "gpu-node-0005", "gpu-node-0007", "gpu-node-0008", "gpu-node-0010")  # the H100s
MERGE = "application/merge-patch+json"
TRANSITIONS = ("change.waiting_for_idle", "change.applying", "change.verifying", "change.succeeded")


def _fleet(sim, core, cluster):
    """The cluster adopted by Tessera and synced, a pool of the five H100 nodes, and a 7×1g.10gb profile on it."""
    driver_for(cluster).adopt_operator_configs()
    for name in POOL_NODES:  # a plugin config selected by label: the rollback target has one to return to
        core.patch_node(name, {"metadata": {"labels": {"nvidia.com/device-plugin.config": "default"}}},
                        _content_type=MERGE)  # fmt: skip
    assert sim.settle()
    sync_cluster_full(cluster)
    pool = NodePool.objects.create(cluster=cluster, name="h100")
    Node.objects.filter(name__in=POOL_NODES).update(pool=pool)
    actor = Actor.system("test-admin")  # no user rows: transactional tests flush the role groups
    profile = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    return cluster, pool


@pytest.fixture
def fleet(db, sim, core, sim_cluster):
    return _fleet(sim, core, sim_cluster)


def start_rollout(**strategy) -> Rollout:
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(**{"canary_count": 0, "batch_size": 10, **strategy})
    return Rollout.objects.get(pk=rollout_id)


def step(rollout: Rollout, now=None) -> None:
    """What the tasks do for one tick: advance the rollout, then step every change in flight."""
    started = services.rollout_advance(rollout.pk, now=now)
    active = list(rollout.changes.filter(status__in=IN_FLIGHT_STATUSES).values_list("pk", flat=True))
    services.node_changes_step(sorted(set(started + active)), now=now)


def drive(rollout: Rollout, sim, *, steps: int = 40) -> Rollout:
    for _ in range(steps):
        step(rollout)
        sim.settle()
        rollout.refresh_from_db()
        if rollout.status != "running":
            return rollout
    raise AssertionError(f"rollout still running: {dict(rollout.changes.values_list('node__name', 'status'))}")


def statuses(rollout) -> dict[str, str]:
    return dict(rollout.changes.values_list("node__name", "status"))


def transitions(change: NodeChange) -> list[str]:
    return list(
        AuditEvent.objects.filter(object_type="nodechange", object_id=str(change.pk))
        .order_by("pk")
        .values_list("action", flat=True)
    )


def assert_runs_its_change(core, change: NodeChange) -> None:
    """The node shows what the change wanted: its labels, MIG Manager's success, GFD labels and allocatable."""
    node = core.read_node(change.node.name)
    labels = node.metadata.labels
    assert labels["nvidia.com/mig.config"] == change.applied_mig_config
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert labels["nvidia.com/device-plugin.config"] == change.to_config["device_plugin_config"]
    assert labels["nvidia.com/mig-1g.10gb.count"] == "56" and labels["nvidia.com/mig.strategy"] == "mixed"
    allocatable = {k: int(v) for k, v in node.status.allocatable.items() if k.startswith("nvidia.com/") and v != "0"}
    assert allocatable == change.to_config["allocatable"] == {"nvidia.com/mig-1g.10gb": 56}


# --- in-process engine -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_profile_rolls_out_to_every_node(sim, core, fleet):
    rollout = start_rollout(canary_count=1, batch_size=2)
    assert drive(rollout, sim).status == "succeeded"
    changes = list(rollout.changes.select_related("node"))
    assert {c.status for c in changes} == {"succeeded"} and len(changes) == 5
    for change in changes:
        assert_runs_its_change(core, change)
        assert transitions(change) == list(TRANSITIONS)
    sync_cluster_full(fleet[0])  # what the watcher records: the loop then sees every node in sync
    assert reconcile.reconcile() == []


@pytest.mark.django_db
def test_unmanaged_cluster_policy_fails_the_change_and_labels_nothing(sim, core, sim_cluster, db):
    cluster, _ = _fleet(sim, core, sim_cluster)
    client.CustomObjectsApi(core.api_client).patch_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", "cluster-policy",
        {"spec": {"migManager": {"config": {"name": ""}}}}, _content_type=MERGE,
    )  # fmt: skip
    assert sim.settle()
    before = {n: core.read_node(n).metadata.labels for n in POOL_NODES}
    rollout = drive(start_rollout(max_failures=5), sim)
    assert rollout.status == "failed"
    for change in rollout.changes.all():
        assert change.status in ("failed", "rolled_back")
        assert "uses the GPU Operator's generated MIG configs" in change.error
    for name in POOL_NODES:
        labels = core.read_node(name).metadata.labels
        assert not labels["nvidia.com/device-plugin.config"].startswith("tessera-")  # never an unwritten key
        assert labels["nvidia.com/mig.config"] == before[name]["nvidia.com/mig.config"]


@pytest.mark.django_db
@pytest.mark.parametrize("failure", ["gpu_in_use_forced", "failing_node"])
def test_failed_apply_rolls_back_to_the_last_good_config(sim, core, fleet, failure):
    node = "gpu-node-0005"
    if failure == "gpu_in_use_forced":
        sim.add_pod(node, "nvidia.com/gpu", 1, namespace="research", controller="Job")
    else:
        sim.faults.update({"failing_nodes": [node]})
    rollout = drive(start_rollout(busy_policy="force", max_failures=3), sim)
    assert rollout.status == "failed"  # one node failed; the others went through
    change = rollout.changes.get(node__name=node)
    assert change.status == "rolled_back"
    assert "MIG Manager reported failed" in change.error and "rolled back to the last good config" in change.error
    labels = core.read_node(node).metadata.labels
    assert (labels["nvidia.com/mig.config"], labels["nvidia.com/device-plugin.config"]) == ("all-disabled", "default")
    assert labels["nvidia.com/mig.config.state"] == "success"  # the old config is still applied on the GPUs
    assert {s for n, s in statuses(rollout).items() if n != node} == {"succeeded"}


@pytest.mark.django_db
def test_wedged_pending_is_retried_under_a_new_name(sim, core, fleet):
    node = "gpu-node-0002"
    sim.faults.update({"wedge": {node: 1}})
    # A timeout long enough for a slow machine's steps, passed on purpose below with `now` (never by waiting).
    rollout = start_rollout(verify_timeout_seconds=60)
    for _ in range(3):
        step(rollout)
        sim.settle()
    change = rollout.changes.select_related("node").get(node__name=node)
    assert change.status == "verifying"
    assert core.read_node(node).metadata.labels["nvidia.com/mig.config.state"] == "pending"  # wedged (#485)
    step(rollout, now=timezone.now() + timedelta(seconds=90))  # past the verify timeout
    change.refresh_from_db()
    assert change.status == "applying" and change.applied_mig_config == change.to_config["mig_config"] + "-r1"
    assert drive(rollout, sim).status == "succeeded"
    change.refresh_from_db()
    assert change.attempts == 2
    assert_runs_its_change(core, change)


@pytest.mark.django_db
def test_busy_gpus_wait_then_fail_after_the_deadline(sim, core, fleet):
    node = "gpu-node-0002"
    pod = sim.add_pod(node, "nvidia.com/gpu", 2, namespace="ml-training", controller="Job")
    rollout = start_rollout(busy_policy="wait", wait_minutes=1, max_failures=3)
    for _ in range(3):
        step(rollout)
        sim.settle()
    change = rollout.changes.get(node__name=node)
    assert change.status == "waiting_for_idle"
    assert change.error == f"waiting: GPUs in use by ml-training/{pod['metadata']['name']}"
    assert core.read_node(node).metadata.labels["nvidia.com/mig.config"] == "all-disabled"  # nothing applied
    step(rollout, now=timezone.now() + timedelta(minutes=2))
    change.refresh_from_db()
    assert change.status == "rolled_back" and change.error.startswith("GPUs still in use after 1 min by ml-training/")
    assert core.read_node(node).metadata.labels["nvidia.com/mig.config"] == "all-disabled"


@pytest.mark.django_db
def test_busy_gpus_drain_cordons_evicts_through_a_budget_and_uncordons(sim, core, fleet):
    node = "gpu-node-0007"
    pods = [sim.add_pod(node, "nvidia.com/mig-1g.10gb", 1, namespace="inference", controller="ReplicaSet")
            for _ in range(2)]  # fmt: skip
    guarded = f"inference/{pods[0]['metadata']['name']}"
    sim.faults.update({"refuse_eviction": {guarded: 1}})  # a PodDisruptionBudget says no, once
    rollout = start_rollout(busy_policy="drain")
    step(rollout)
    change = rollout.changes.get(node__name=node)
    assert change.status == "waiting_for_idle" and change.cordoned_by_tessera
    assert change.error == f"draining: eviction of {guarded} refused (PodDisruptionBudget), retrying"
    assert core.read_node(node).spec.unschedulable is True
    assert drive(rollout, sim).status == "succeeded"
    change.refresh_from_db()
    assert_runs_its_change(core, change)
    assert not core.read_node(node).spec.unschedulable  # uncordoned after success
    assert not [p for p in core.list_namespaced_pod("inference").items if p.spec.node_name == node]
    assert transitions(change).count("change.cordon") == 1


@pytest.mark.django_db
def test_drain_with_a_zero_minute_wait_drains_first_then_checks(sim, core, fleet):
    """Issue 17: a 0-minute wait failed the node at once ("GPUs still in use after 0 min") without draining it."""
    node = "gpu-node-0005"
    pod = sim.add_pod(node, "nvidia.com/mig-1g.10gb", 1, namespace="inference", controller="ReplicaSet")
    guarded = f"inference/{pod['metadata']['name']}"
    sim.faults.update({"refuse_eviction": {guarded: 2}})  # the budget says no twice: the pod outlives a 0-min wait
    rollout = start_rollout(busy_policy="drain", wait_minutes=0, verify_timeout_seconds=120)
    step(rollout)
    change = rollout.changes.get(node__name=node)
    assert change.status == "waiting_for_idle" and change.cordoned_by_tessera
    assert change.deadline == change.drain_started_at + timedelta(seconds=120)  # the normal verification timeout
    step(rollout)
    change.refresh_from_db()
    assert change.status == "waiting_for_idle"
    assert drive(rollout, sim).status == "succeeded"
    change.refresh_from_db()
    assert_runs_its_change(core, change)
    assert not core.read_node(node).spec.unschedulable


@pytest.mark.django_db
def test_drain_that_never_empties_the_gpus_fails_after_the_verification_timeout(sim, core, fleet):
    node = "gpu-node-0008"
    pod = sim.add_pod(node, "nvidia.com/mig-1g.10gb", 1, namespace="inference", controller="ReplicaSet")
    sim.faults.update({"refuse_eviction": {f"inference/{pod['metadata']['name']}": 1000}})
    rollout = start_rollout(busy_policy="drain", wait_minutes=0, verify_timeout_seconds=60, max_failures=5)
    step(rollout)
    change = rollout.changes.get(node__name=node)
    step(rollout, now=timezone.now() + timedelta(seconds=30))
    change.refresh_from_db()
    assert change.status == "waiting_for_idle"
    step(rollout, now=timezone.now() + timedelta(seconds=61))
    change.refresh_from_db()
    assert change.status in ("failed", "rolled_back")
    assert change.error.startswith("GPUs still in use 6")  # "… 61 s after the drain began by inference/…"
    assert "s after the drain began by inference/" in change.error
    assert not core.read_node(node).spec.unschedulable  # uncordoned on failure


@pytest.mark.django_db
def test_busy_gpus_skip_leaves_the_node_alone(sim, core, fleet):
    node = "gpu-node-0010"
    sim.add_pod(node, "nvidia.com/mig-3g.40gb", 1, namespace="research", controller="Job")
    rollout = drive(start_rollout(busy_policy="skip"), sim)
    assert statuses(rollout)[node] == "skipped"
    assert core.read_node(node).metadata.labels["nvidia.com/mig.config"] == "all-balanced"
    assert rollout.status == "succeeded"


@pytest.mark.django_db
def test_rollout_completes_through_20_percent_api_errors(sim, core, fleet):
    sim.faults.update({"error_rate": 0.2, "error_codes": [500, 503, 429, 409]})
    rollout = drive(start_rollout(canary_count=1, batch_size=3), sim, steps=60)
    sim.faults.update({"error_rate": 0.0})
    assert rollout.status == "succeeded"
    for change in rollout.changes.select_related("node"):
        assert_runs_its_change(core, change)
        assert transitions(change) == list(TRANSITIONS)  # retries never doubled a transition


# --- real worker processes ---------------------------------------------------------------------------------------


@pytest.fixture
def broker(tmp_path, monkeypatch):
    """This process publishes to the filesystem broker a real worker (sharing the test database) consumes."""
    folders = {key: tmp_path / "celery" / name for key, name in
               (("data_folder_in", "queue"), ("data_folder_out", "queue"), ("processed_folder", "processed"),
                ("control_folder", "control"))}  # fmt: skip
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    options = {key: str(path) for key, path in folders.items()} | {"polling_interval": 0.05, "store_processed": False}
    saved = (app.conf.task_always_eager, app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.task_always_eager, app.conf.broker_url, app.conf.broker_transport_options = False, "tessera-fs://", options
    app._pool = app.amqp._producer_pool = None  # connections are made afresh for these broker options
    monkeypatch.setenv("TESSERA_STEP_POLL_SECONDS", "0.3")  # the worker polls verifying nodes this often
    yield tmp_path, folders["data_folder_in"]
    app.conf.task_always_eager, app.conf.broker_url, app.conf.broker_transport_options = saved
    app._pool = app.amqp._producer_pool = None


def _tick(rollout_id: int) -> None:
    """The reconcile tick 30 s later, as beat would fire it: stalled changes (their poll task died with the
    worker) are re-stepped. The clock is moved instead of waited for."""
    ids = services.rollout_advance(rollout_id, now=timezone.now() + timedelta(seconds=services.STEP_STALL_SECONDS + 1))
    if ids:
        node_changes_step.delay(ids, rollout_id)
    rollout_advance.delay(rollout_id)


def _settled(rollout_id: int) -> bool:
    return Rollout.objects.get(pk=rollout_id).status != "running"


@pytest.mark.django_db(transaction=True)
def test_worker_killed_mid_rollout_resumes_without_duplicate_or_lost_steps(sim, core, sim_cluster, broker):
    var_dir, _ = broker
    sim.faults.update({"apply_delay": 1.0})
    _fleet(sim, core, sim_cluster)
    with celery_worker(var_dir, "tessera-fs://", log_path=var_dir / "worker-1.log") as first:
        rollout = start_rollout(canary_count=1, batch_size=2)  # commits: on_commit publishes rollout_advance
        wait_until(lambda: rollout.changes.filter(status="succeeded").exists(), timeout=40, message="a first node")
        wait_until(lambda: rollout.changes.filter(status__in=["applying", "verifying"]).exists(), timeout=20,
                   message="nodes mid-change")  # fmt: skip
        kill_tree(first.pid)
        first.wait(10)
    assert first.returncode == -signal.SIGKILL
    in_flight = statuses(rollout)
    assert "succeeded" in in_flight.values() and set(in_flight.values()) != {"succeeded"}
    with celery_worker(var_dir, "tessera-fs://", log_path=var_dir / "worker-2.log"):
        for _ in range(12):
            _tick(rollout.pk)
            try:
                wait_until(lambda: _settled(rollout.pk), timeout=5, message="the rollout to finish")
                break
            except AssertionError:
                continue
    rollout.refresh_from_db()
    assert rollout.status == "succeeded", statuses(rollout)
    for change in rollout.changes.select_related("node"):
        assert transitions(change) == list(TRANSITIONS), change.node.name  # each transition exactly once
        assert change.attempts == 1
        assert_runs_its_change(core, change)


@pytest.mark.django_db(transaction=True)
def test_broker_down_then_up_loses_no_change(sim, core, sim_cluster, broker):
    var_dir, queue_dir = broker
    _fleet(sim, core, sim_cluster)
    hidden = queue_dir.with_name("queue-unreachable")
    queue_dir.rename(hidden)  # the broker is down: nothing can be published or consumed
    with pytest.raises(Exception):  # noqa: B017 - whatever kombu raises for an unreachable broker
        start_rollout()  # the rollout commits; publishing its first task fails
    (rollout_id,) = Rollout.objects.values_list("pk", flat=True)
    assert set(statuses(Rollout.objects.get(pk=rollout_id)).values()) == {"queued"}
    time.sleep(1)
    hidden.rename(queue_dir)  # the broker is back
    with celery_worker(var_dir, "tessera-fs://", log_path=var_dir / "worker.log"):
        app.send_task("worker.tasks.reconcile_tick", connection=Connection("tessera-fs://",
                      transport_options=app.conf.broker_transport_options))  # fmt: skip
        wait_until(lambda: _settled(rollout_id), timeout=60, message="the rollout to finish after the outage")
    rollout = Rollout.objects.get(pk=rollout_id)
    assert rollout.status == "succeeded"
    assert Counter(statuses(rollout).values()) == {"succeeded": 5}
    for change in rollout.changes.select_related("node"):
        assert transitions(change) == list(TRANSITIONS)
        assert_runs_its_change(core, change)
