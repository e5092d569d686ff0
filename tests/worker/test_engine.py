"""The rollout engine over the agent driver (state comes from node reports): planning, batches, canaries,
verification, retries under a new name, failures, rollback, pause/resume/cancel, duplicate steps."""

import logging
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from fleet import services as fleet_services
from fleet.models import Node
from fleet.observations import GpuObservation, NodeObservation
from scheduling import services as scheduling_services
from sharing import services as sharing_services
from worker import reconcile, rollouts, services
from worker.choices import ChangeStatus, RolloutStatus
from worker.models import NodeChange, NodeDrift, NodeRetry, Rollout
from worker.selectors import PlannedChange, rollout_progress, stuck_nodes_q

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


def test_a_rollout_logs_one_line_when_it_starts_and_one_when_it_ends_once_committed(
    fleet, admin_user, caplog, django_capture_on_commit_callbacks
):
    """What `make run`'s terminal shows of rollouts (logger tessera.rollouts), and nothing for a rolled-back one."""
    cluster, _, _ = fleet
    caplog.set_level(logging.INFO, logger="tessera.rollouts")
    with django_capture_on_commit_callbacks() as callbacks:
        (rollout_id,) = reconcile.reconcile()
        rollout = _run(Rollout.objects.get(pk=rollout_id), cluster)
    assert [r.getMessage() for r in caplog.records] == []  # nothing committed yet
    for callback in callbacks:
        callback()
    lines = [r.getMessage() for r in caplog.records if r.name == "tessera.rollouts"]
    assert lines == [
        f"Rollout #{rollout_id} started: {rollout.title} — by reconcile",
        f"Rollout #{rollout_id} succeeded: {rollout.title}",
    ]
    caplog.clear()
    actor = Actor.for_user(admin_user)
    sharing_services.pool_set_profile(actor=actor, pool=rollout.pool, profile=_whole(actor))
    (second,) = reconcile.reconcile()
    with django_capture_on_commit_callbacks(execute=True):
        rollouts.rollout_cancel(actor=actor, rollout=Rollout.objects.get(pk=second))
    lines = [r.getMessage() for r in caplog.records if r.name == "tessera.rollouts"]
    assert lines == [f"Rollout #{second} cancelled: {Rollout.objects.get(pk=second).title} — by admin"]


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


def _fail_canary(cluster, rollout_id):
    """Start the rollout's canary and have its agent report MIG Manager failing; returns the canary's change."""
    (canary,) = services.rollout_advance(rollout_id)
    services.node_changes_step([canary])
    change = NodeChange.objects.select_related("node").get(pk=canary)
    _report_applied(cluster, change, state="failed")
    services.node_changes_step([canary])
    change.refresh_from_db()
    return change


def test_mig_manager_failure_rolls_back_and_loop_retries_after_a_growing_back_off(fleet, settings):
    settings.TESSERA = {**settings.TESSERA, "RETRY_BACKOFF_SECONDS": 60, "RETRY_BACKOFF_MAX_SECONDS": 200}
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1, max_failures=1)
    change = _fail_canary(cluster, rollout_id)
    assert change.status == ChangeStatus.ROLLED_BACK
    assert "MIG Manager reported failed" in change.error
    services.rollout_advance(rollout_id)
    rollout = Rollout.objects.get(pk=rollout_id)
    assert rollout.status == RolloutStatus.FAILED
    assert rollout.changes.filter(status="cancelled").count() == 4
    retry = NodeRetry.objects.get(node=change.node)
    assert (retry.failures, retry.config_id) == (1, change.to_config["config_id"])
    assert 59 <= (retry.next_retry_at - change.finished_at).total_seconds() <= 61
    # The other nodes are held back with it, not started at once toward the config that just failed.
    held = NodeRetry.objects.exclude(node=change.node)
    assert held.count() == 4 and {r.failures for r in held} == {0}
    assert {r.next_retry_at for r in held} == {retry.next_retry_at}
    assert reconcile.reconcile() == []
    assert dict(NodeDrift.objects.values_list("node__name", "reason")) == {
        "n0": "failed", "n1": "held", "n2": "held", "n3": "held", "n4": "held"
    }  # fmt: skip

    # After the back-off, one rollout tries every node again, canary first; a second failure waits twice as long.
    (again,) = reconcile.reconcile(at=retry.next_retry_at + timedelta(seconds=1))
    assert Rollout.objects.get(pk=again).changes.count() == 5
    Rollout.objects.filter(pk=again).update(canary_count=1, max_failures=1)
    second = _fail_canary(cluster, again)
    assert second.node_id == change.node_id
    retry.refresh_from_db()
    assert retry.failures == 2
    assert 119 <= (retry.next_retry_at - second.finished_at).total_seconds() <= 121
    assert services.backoff_seconds(3) == 200  # capped


def test_a_failed_canary_fails_the_rollout_at_once_below_max_failures(fleet):
    """Issue 17: with max_failures 2 a failed canary left the rollout "Running 1/5 20 %" forever, the rest queued."""
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1, max_failures=2)
    canary = _fail_canary(cluster, rollout_id)
    services.rollout_advance(rollout_id)
    rollout = Rollout.objects.with_progress().get(pk=rollout_id)
    assert rollout.status == RolloutStatus.FAILED
    progress = rollout_progress(rollout)  # finished: the canary ran, the rest never will (not counted as done)
    assert (progress["finished"], progress["total"], progress["cancelled"], progress["percent"]) == (5, 5, 4, 20)
    assert set(rollout.changes.exclude(pk=canary.pk).values_list("status", flat=True)) == {"cancelled"}
    event = AuditEvent.objects.get(action="rollout.failed", object_id=str(rollout_id))
    assert event.message.startswith(f"canary {canary.node.name} failed: MIG Manager reported failed")


def test_a_failed_canary_pauses_the_rollout_when_its_strategy_says_so(fleet, admin_user):
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1, max_failures=2, on_failure="pause")
    canary = _fail_canary(cluster, rollout_id)
    services.rollout_advance(rollout_id)
    rollout = Rollout.objects.get(pk=rollout_id)
    assert rollout.status == RolloutStatus.PAUSED
    assert rollout.changes.filter(status="queued").count() == 4
    assert reconcile.reconcile() == []  # the paused rollout keeps its nodes; the failed one backs off
    # Resuming accepts the failure: the next node is the canary, then the rest go.
    rollouts.rollout_resume(actor=Actor.for_user(admin_user), rollout=rollout)
    assert Rollout.objects.get(pk=rollout_id).accepted_failures == 1
    assert len(services.rollout_advance(rollout_id)) == 1
    rollout = _run(rollout, cluster)
    assert rollout.status == RolloutStatus.FAILED  # one node never got its config
    statuses = dict(rollout.changes.values_list("node__name", "status"))
    assert statuses.pop(canary.node.name) == ChangeStatus.ROLLED_BACK
    assert set(statuses.values()) == {"succeeded"}
    assert set(NodeRetry.objects.values_list("node__name", flat=True)) == {canary.node.name}


def test_a_skipped_canary_hands_the_canary_role_to_the_next_node(fleet):
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1, batch_size=5)
    (first,) = services.rollout_advance(rollout_id)
    services._claim(list(NodeChange.objects.filter(pk=first).select_related("node")), "waiting_for_idle", "skipped")
    (second,) = services.rollout_advance(rollout_id)  # alone: a skipped node proved nothing
    assert second != first


def test_an_agent_node_with_qos_settings_that_failed_is_not_restarted_every_pass(fleet, admin_user):
    """Issue 17: the loop compared the failure with the profile's config id, the change carried the one with the QoS
    settings: every pass started a one-node rollout for the node that had just failed."""
    cluster, pool, _ = fleet
    actor = Actor.for_user(admin_user)
    policy = sharing_services.qos_policy_create(actor=actor, name="training", transparent_hugepages="always")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1, max_failures=1)
    _fail_canary(cluster, rollout_id)
    services.rollout_advance(rollout_id)
    assert reconcile.reconcile() == []
    assert reconcile.reconcile() == []


def test_retry_now_ends_the_back_off_and_is_audited(fleet, operator):
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=1, max_failures=1)
    canary = _fail_canary(cluster, rollout_id)
    services.rollout_advance(rollout_id)
    assert rollouts.retry_now(actor=Actor.for_user(operator), nodes=[canary.node]) == 1
    (again,) = reconcile.reconcile()
    assert list(NodeChange.objects.filter(rollout_id=again).values_list("node_id", flat=True)) == [canary.node_id]
    event = AuditEvent.objects.get(action="node.retry_now")
    assert (event.actor_label, event.object_id) == ("operator", str(canary.node_id))
    assert rollouts.retry_now(actor=Actor.for_user(operator), nodes=[canary.node]) == 0  # nothing waits now


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
    # Past the service's check (two passes racing), the partial unique index refuses the second active change.
    other = Rollout.objects.create(title="racing pass", trigger="reconcile", actor_label="reconcile")
    with pytest.raises(IntegrityError), transaction.atomic():
        NodeChange.objects.create(rollout=other, node=change.node, position=0, to_config=change.to_config)


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


def _whole(actor):
    return sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])


def test_a_new_pool_default_supersedes_the_rollout_toward_the_old_one(fleet, admin_user):
    cluster, pool, _ = fleet
    actor = Actor.for_user(admin_user)
    (old_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=old_id).update(canary_count=1)
    (canary,) = services.rollout_advance(old_id)
    services.node_changes_step([canary])  # mid-apply: verifying
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=_whole(actor))

    (new_id,) = reconcile.reconcile()
    old = Rollout.objects.get(pk=old_id)
    assert (old.status, old.superseded_by_id) == (RolloutStatus.SUPERSEDED, new_id)
    assert old.finished_at is not None
    statuses = dict(old.changes.values_list("pk", "status"))
    assert statuses.pop(canary) == ChangeStatus.VERIFYING  # finishes and is verified, then follows the new state
    assert set(statuses.values()) == {"cancelled"}
    event = AuditEvent.objects.get(action="rollout.superseded", object_id=str(old_id))
    assert event.message == "superseded: pool " + pool.name + "'s default profile is now whole by " + "admin"
    assert (
        AuditEvent.objects.get(action="rollout.superseded_by").message
        == f"rollout #{new_id} took over 4 of its node(s)"
    )
    assert NodeChange.objects.filter(rollout_id=new_id).count() == 4
    assert "superseded" in old.changes.filter(status="cancelled").first().error

    _run(old, cluster)  # the canary's config verifies; the loop then rolls it to the new default
    assert NodeChange.objects.get(pk=canary).status == ChangeStatus.SUCCEEDED
    (follow,) = reconcile.reconcile()
    assert NodeChange.objects.get(rollout_id=follow).node_id == NodeChange.objects.get(pk=canary).node_id


def test_a_pin_supersedes_only_its_nodes_change(fleet, admin_user):
    _, _, _ = fleet
    actor = Actor.for_user(admin_user)
    (old_id,) = reconcile.reconcile()
    node = Node.objects.get(name="n3")
    sharing_services.node_pin_profile(actor=actor, node=node, profile=_whole(actor))
    (new_id,) = reconcile.reconcile()
    old = Rollout.objects.get(pk=old_id)
    assert old.status == RolloutStatus.RUNNING  # four nodes still want its config
    change = old.changes.get(node=node)
    assert (change.status, change.error) == ("cancelled", "superseded: n3 pinned to whole by admin")
    assert list(NodeChange.objects.filter(rollout_id=new_id).values_list("node__name", flat=True)) == ["n3"]


def test_a_schedule_window_supersedes_the_rollout_of_the_window_before(fleet, admin_user):
    _, pool, profile = fleet
    actor = Actor.for_user(admin_user)
    scheduling_services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=profile, night_profile=_whole(actor), time_zone="UTC", name="dn"
    )
    (day_id,) = reconcile.reconcile(at=datetime(2026, 3, 27, 19, 59, tzinfo=UTC))  # a Friday, 19:59
    (night_id,) = reconcile.reconcile(at=datetime(2026, 3, 27, 20, 0, tzinfo=UTC))
    day = Rollout.objects.get(pk=day_id)
    assert (day.status, day.superseded_by_id) == (RolloutStatus.SUPERSEDED, night_id)
    event = AuditEvent.objects.get(action="rollout.superseded")
    assert event.message == f"superseded: schedule dn now gives pool {pool.name} whole"


def test_the_overview_counts_a_rolled_back_node_as_failed_and_a_change_not_moving_as_stuck(
    fleet, operator, client, viewer
):
    """Issue 17: the overview said "pending too long: 0" and nothing failed while a failed canary's rollout sat."""
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    canary = _fail_canary(cluster, rollout_id)
    services.rollout_advance(rollout_id)
    # After the rollback the agent reports its former config, applied successfully.
    fleet_services.inventory_record(cluster=cluster, nodes=[_observation(canary.node.name, mig_config="all-disabled",
                                                                          dp="whole")])  # fmt: skip
    rollouts.retry_now(actor=Actor.for_user(operator), nodes=Node.objects.filter(name="n4"))
    (second,) = reconcile.reconcile()
    (stuck,) = services.rollout_advance(second)
    services.node_changes_step([stuck])
    long_ago = timezone.now() - timedelta(minutes=15)
    NodeChange.objects.filter(pk=stuck).update(status_since=long_ago, deadline=long_ago)  # verifying, overdue
    reconcile.reconcile()  # a full pass records why each node differs

    client.force_login(viewer)
    stats = client.get("/").context["stats"]
    assert (stats["failed"], stats["stuck"]) == (1, 1)
    assert stats["next_retry_at"] == NodeRetry.objects.get(node=canary.node).next_retry_at
    assert Node.objects.filter(config_state="failed").count() == 0  # every node reports success


def test_queued_nodes_are_stuck_only_while_their_rollout_stopped_advancing(fleet):
    (rollout_id,) = reconcile.reconcile()
    NodeChange.objects.update(status_since=timezone.now() - timedelta(minutes=15))
    stuck = Node.objects.filter(stuck_nodes_q())
    assert stuck.count() == 5  # running, queued for 15 min, nothing in flight: its tasks were lost
    services.rollout_advance(rollout_id)  # the canary starts: the queued ones wait behind a working node
    assert stuck.count() == 0


def test_each_transition_audits_every_moved_change_once(fleet):
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(canary_count=0)
    started = services.rollout_advance(rollout_id)
    services.node_changes_step(started[:3])
    events = AuditEvent.objects.filter(action="change.verifying").order_by("object_id")
    changes = NodeChange.objects.filter(pk__in=started[:3]).select_related("node").order_by("pk")
    assert [(e.object_type, e.object_id, e.object_repr) for e in events] == [
        ("nodechange", str(c.pk), f"{c.node.name} (rollout #{rollout_id})") for c in changes
    ]
    event = events[0]
    assert (event.actor_kind, event.actor_label, event.actor_id) == ("system", "tessera-worker", None)
    assert (event.before, event.after, event.message) == ({"status": "applying"}, {"status": "verifying"}, "")
    assert AuditEvent.objects.filter(action="change.waiting_for_idle").count() == 5


@pytest.mark.django_db(transaction=True)
def test_a_claim_moves_changes_while_another_transaction_holds_their_rollout(fleet):
    """Steps of one rollout run in parallel chunks, beside rollout_advance holding the rollout's row."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks (SKIP LOCKED) need PostgreSQL")
    reconcile.reconcile()  # (committed at once here, setting the profile may have planned it already)
    rollout_id = Rollout.objects.get().pk
    changes = list(NodeChange.objects.filter(rollout_id=rollout_id, status=ChangeStatus.QUEUED))
    locked, release = threading.Event(), threading.Event()

    def hold():
        with transaction.atomic():
            Rollout.objects.select_for_update().get(pk=rollout_id)
            locked.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        moved = services._claim(changes, ChangeStatus.QUEUED, ChangeStatus.CANCELLED, error="test")
    finally:
        release.set()
        holder.join()
    assert changes and len(moved) == len(changes)
