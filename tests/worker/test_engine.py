"""The rollout engine over the agent driver (state comes from node reports): planning, batches, canaries,
verification, retries under a new name, failures, rollback, pause/resume/cancel, duplicate steps."""

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from fleet import services as fleet_services
from fleet.models import Node
from fleet.observations import GpuObservation, NodeObservation
from sharing import services as sharing_services
from tests.factories import ClusterFactory, NodePoolFactory
from worker import reconcile, rollouts, services
from worker.choices import ChangeStatus, RolloutStatus
from worker.models import NodeChange, Rollout
from worker.selectors import PlannedChange

pytestmark = pytest.mark.django_db
H100 = "NVIDIA-H100-80GB-HBM3"


def _observation(name, *, mig_config="", dp="", state="success", allocatable=None, mig=False):
    gpus = tuple(
        GpuObservation(
            index=i, uuid=f"GPU-{name}-{i}", product=H100, memory_mib=81559, mig_capable=True, mig_enabled=mig
        )
        for i in range(2)
    )
    return NodeObservation(
        name=name,
        ready=True,
        observed_mode="mig" if mig else "passthrough",
        observed_mig_config=mig_config,
        observed_device_plugin_config=dp,
        config_state=state,
        allocatable=allocatable if allocatable is not None else {"nvidia.com/gpu": 2},
        gpus=gpus,
    )


@pytest.fixture
def fleet(admin_user):
    """An agent cluster with a pool of 5 nodes running passthrough, and a MIG profile assigned to the pool."""
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster)
    fleet_services.inventory_record(
        cluster=cluster, nodes=[_observation(f"n{i}", mig_config="all-disabled", dp="whole") for i in range(5)]
    )
    Node.objects.update(pool=pool)
    actor = Actor.for_user(admin_user)
    profile = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    return cluster, pool, profile


def _report_applied(cluster, change: NodeChange, *, state="success", allocatable=None):
    """What an agent reports after applying: the config (id and names) it now runs, its state and resources."""
    to = change.to_config
    obs = _observation(
        change.node.name,
        mig_config=change.applied_mig_config,
        dp=to["device_plugin_config"],
        state=state,
        allocatable=to["allocatable"] if allocatable is None else allocatable,
        mig=True,
    )
    fleet_services.inventory_record(cluster=cluster, nodes=[obs])
    Node.objects.filter(pk=change.node_id).update(agent_config_id=to["config_id"])


def _run(rollout, cluster, *, report=True):
    """Drive a rollout to the end like the tasks would, reporting every applied node as an agent would."""
    for _ in range(50):
        ids = services.rollout_advance(rollout.pk)
        in_flight = list(rollout.changes.filter(status__in=["waiting_for_idle", "applying", "verifying"]))
        services.node_changes_step(ids + [c.pk for c in in_flight])
        if report:
            for change in rollout.changes.filter(status="verifying").select_related("node"):
                _report_applied(cluster, change)
        services.node_changes_step([c.pk for c in rollout.changes.all()])
        rollout.refresh_from_db()
        if rollout.status != RolloutStatus.RUNNING:
            return rollout
    raise AssertionError("rollout did not finish")


def test_reconcile_plans_one_rollout_for_drifted_nodes_and_is_idempotent(fleet):
    created = reconcile.reconcile()
    assert len(created) == 1
    rollout = Rollout.objects.get()
    assert rollout.changes.count() == 5
    change = rollout.changes.first()
    assert change.to_config["mig_config"].startswith("tessera-mig-")
    assert change.to_config["allocatable"] == {"nvidia.com/mig-1g.10gb": 14}
    assert change.from_config["mig_config"] == "all-disabled"
    assert reconcile.reconcile() == []  # changes in flight: nothing new


def test_rollout_reaches_every_node_with_canary_and_batches(fleet):
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    rollout = Rollout.objects.get(pk=rollout_id)
    Rollout.objects.filter(pk=rollout_id).update(batch_size=2, canary_count=1)
    first = services.rollout_advance(rollout_id)
    assert len(first) == 1  # only the canary starts
    services.node_changes_step(first)
    assert NodeChange.objects.get(pk=first[0]).status == ChangeStatus.VERIFYING
    assert services.rollout_advance(rollout_id) == []  # the rest wait for the canary
    rollout = _run(rollout, cluster)
    assert rollout.status == RolloutStatus.SUCCEEDED
    assert set(rollout.changes.values_list("status", flat=True)) == {"succeeded"}
    assert reconcile.reconcile() == []  # in sync now
    actions = set(AuditEvent.objects.filter(object_type="nodechange").values_list("action", flat=True))
    assert {"change.waiting_for_idle", "change.applying", "change.verifying", "change.succeeded"} <= actions
    assert AuditEvent.objects.filter(action="rollout.succeeded", object_id=str(rollout_id)).exists()


def test_batch_size_limits_nodes_in_flight(fleet):
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(batch_size=2, canary_count=0)
    started = services.rollout_advance(rollout_id)
    services.node_changes_step(started)
    assert len(started) == 2
    assert services.rollout_advance(rollout_id) == []
    assert NodeChange.objects.filter(status="queued").count() == 3


def test_duplicate_steps_and_advances_do_nothing_twice(fleet):
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=0)
    started = services.rollout_advance(rollout_id)
    services.node_changes_step(started)
    services.node_changes_step(started)
    assert services.rollout_advance(rollout_id) == []
    verifying = AuditEvent.objects.filter(action="change.verifying").count()
    assert verifying == len(started) == 5
    assert NodeChange.objects.filter(attempts=1).count() == 5


def test_mig_manager_failure_rolls_back_and_loop_does_not_retry_forever(fleet):
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1, max_failures=1)
    (canary,) = services.rollout_advance(rollout_id)
    services.node_changes_step([canary])
    change = NodeChange.objects.select_related("node").get(pk=canary)
    _report_applied(cluster, change, state="failed")
    services.node_changes_step([canary])
    change.refresh_from_db()
    assert change.status == ChangeStatus.ROLLED_BACK
    assert "MIG Manager reported failed" in change.error
    services.rollout_advance(rollout_id)
    rollout = Rollout.objects.get(pk=rollout_id)
    assert rollout.status == RolloutStatus.FAILED
    assert rollout.changes.filter(status="cancelled").count() == 4
    # The failed node is left for a human; the others are planned again.
    again = reconcile.reconcile()
    assert NodeChange.objects.filter(rollout_id__in=again).count() == 4


def test_an_agents_earlier_failure_is_not_read_as_the_new_change_failing(fleet):
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1)
    (canary,) = services.rollout_advance(rollout_id)
    services.node_changes_step([canary])
    change = NodeChange.objects.select_related("node").get(pk=canary)
    # An earlier attempt at the same MIG config failed on the node, which still runs its former config id.
    _report_applied(cluster, change, state="failed")
    Node.objects.filter(pk=change.node_id).update(agent_config_id="tessera-cfg-former")
    services.node_changes_step([canary])
    change.refresh_from_db()
    assert (change.status, change.error) == (ChangeStatus.VERIFYING, "")
    _report_applied(cluster, change)  # the agent applies this change's config
    services.node_changes_step([canary])
    change.refresh_from_db()
    assert change.status == ChangeStatus.SUCCEEDED


def test_wedged_pending_retries_under_a_new_name_then_fails(fleet):
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=0, verify_timeout_seconds=60, max_attempts=2)
    ids = services.rollout_advance(rollout_id)
    services.node_changes_step(ids)
    change = NodeChange.objects.select_related("node").get(pk=ids[0])
    _report_applied(cluster, change, state="pending", allocatable={})
    later = timezone.now() + timedelta(seconds=61)
    services.node_changes_step([change.pk], now=later)
    change.refresh_from_db()
    assert change.status == ChangeStatus.APPLYING
    assert change.applied_mig_config == change.to_config["mig_config"] + "-r1"
    services.node_changes_step([change.pk])
    change.refresh_from_db()
    assert (change.status, change.attempts) == (ChangeStatus.VERIFYING, 2)
    _report_applied(cluster, change, state="pending", allocatable={})
    services.node_changes_step([change.pk], now=timezone.now() + timedelta(seconds=61))
    change.refresh_from_db()
    assert change.status == ChangeStatus.ROLLED_BACK
    assert "still pending after 60 s" in change.error


def test_pause_resume_cancel(fleet, admin_user):
    actor = Actor.for_user(admin_user)
    (rollout_id,) = reconcile.reconcile()
    rollout = Rollout.objects.get(pk=rollout_id)
    rollouts.rollout_pause(actor=actor, rollout=rollout)
    assert services.rollout_advance(rollout_id) == []
    with pytest.raises(ApplicationError):
        rollouts.rollout_pause(actor=actor, rollout=rollout)
    rollouts.rollout_resume(actor=actor, rollout=rollout)
    assert len(services.rollout_advance(rollout_id)) == 1
    rollouts.rollout_cancel(actor=actor, rollout=rollout)
    assert set(rollout.changes.values_list("status", flat=True)) == {"cancelled"}
    assert Rollout.objects.get(pk=rollout_id).status == RolloutStatus.CANCELLED
    actions = list(AuditEvent.objects.filter(object_type="rollout").values_list("action", flat=True).order_by("pk"))
    assert actions == ["rollout.create", "rollout.pause", "rollout.resume", "rollout.cancel"]


def test_one_active_change_per_node_is_a_database_rule(fleet):
    (rollout_id,) = reconcile.reconcile()
    change = NodeChange.objects.filter(rollout_id=rollout_id).select_related("node").first()
    with pytest.raises(ApplicationError):
        rollouts.rollout_create(
            actor=Actor.system(),
            trigger="user",
            title="again",
            changes=[PlannedChange(change.node, change.to_config)],
        )


def test_stale_and_not_ready_nodes_are_not_planned(fleet):
    cluster, _, _ = fleet
    Node.objects.filter(name="n0").update(last_seen_at=timezone.now() - timedelta(hours=1))
    fleet_services.inventory_record(
        cluster=cluster, nodes=[replace(_observation("n1", mig_config="all-disabled", dp="whole"), ready=False)]
    )
    (rollout_id,) = reconcile.reconcile()
    names = set(NodeChange.objects.filter(rollout_id=rollout_id).values_list("node__name", flat=True))
    assert names == {"n2", "n3", "n4"}


def test_qos_node_settings_reach_agent_nodes_and_drive_drift(fleet, admin_user):
    cluster, pool, profile = fleet
    actor = Actor.for_user(admin_user)
    (first,) = reconcile.reconcile()
    _run(Rollout.objects.get(pk=first), cluster)
    plain_id = NodeChange.objects.filter(rollout_id=first).first().to_config["config_id"]
    Node.objects.update(agent_config_id=plain_id)  # what the agents report having applied
    assert reconcile.reconcile() == []

    policy = sharing_services.qos_policy_create(actor=actor, name="training", transparent_hugepages="always")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    (second,) = reconcile.reconcile()
    to = NodeChange.objects.filter(rollout_id=second).first().to_config
    assert to["node_settings"] == {"gpu": {}, "host": {"transparent_hugepages": "always"}}
    assert (
        to["config_id"] != plain_id
        and to["mig_config"] == NodeChange.objects.filter(rollout_id=first).first().to_config["mig_config"]
    )
