"""The incremental reconcile tick (worker/reconcile.py, worker/marks.py) evaluates only what could have changed, and
its result equals a full evaluation's: held by a randomised run of edits, pins, window crossings and drifts."""

import random
from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.audit import Actor
from fleet import services as fleet_services
from fleet.models import Cluster, Gpu, Node
from scheduling.models import Schedule, ScheduleWindow
from scheduling.selectors import enabled_calendars
from sharing import services as sharing_services
from sharing.models import NodePin, PoolSharing, SharingProfile
from tests.factories import ClusterFactory, NodePoolFactory
from tests.worker.test_engine import H100, _observation
from worker import marks, reconcile, tasks
from worker.choices import ACTIVE_CHANGE_STATUSES, ChangeStatus
from worker.models import NodeChange, NodeDrift, ReconcileMark, ReconcileState, Rollout
from worker.rollouts import rollouts_supersede
from worker.selectors import drift, reconcilable_nodes

MONDAY_6_UTC = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)


@pytest.fixture
def small_fleet(admin_user, settings):
    """Twelve nodes of two H100s in three pools; pool 0 on a day/night schedule in Berlin; three profiles."""
    settings.TESSERA = {**settings.TESSERA, "RECONCILE_FULL_SECONDS": 10**9}  # only the incremental tick here
    actor = Actor.for_user(admin_user)
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    fleet_services.inventory_record(
        cluster=cluster, nodes=[_observation(f"n{i:02d}", mig_config="all-disabled", dp="whole") for i in range(12)]
    )
    pools = [NodePoolFactory(cluster=cluster, name=f"p{i}") for i in range(3)]
    for i, node in enumerate(Node.objects.order_by("name")):
        node.pool = pools[i % 3]
        node.save(update_fields=["pool"])
    profiles = [
        sharing_services.profile_create(
            actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
        ),
        sharing_services.profile_create(
            actor=actor, name="mig-2", mode="mig", target_products=[H100], mig_layouts={"all": {"3g.40gb": 2}}
        ),
        sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100]),
    ]
    schedule = Schedule.objects.create(
        pool=pools[0], name="day-night", time_zone="Europe/Berlin", baseline_profile=profiles[2]
    )
    ScheduleWindow.objects.create(
        schedule=schedule, name="day", weekdays=[0, 1, 2, 3, 4], start=time(8), end=time(20), profile=profiles[0]
    )
    return actor, cluster, pools, profiles


def _full_drift(at) -> dict[int, str]:
    full = drift(reconcilable_nodes(), at=at)
    return {row.node.pk: full.reason(row) for row in full.rows}


def _apply_changes(rng: random.Random) -> None:
    """Some in-flight changes end: applied (the node reports the config) or failed (it reports the failure)."""
    for change in NodeChange.objects.filter(status__in=ACTIVE_CHANGE_STATUSES).select_related("node"):
        if rng.random() < 0.5:
            continue
        ok = rng.random() < 0.8
        change.status = ChangeStatus.SUCCEEDED if ok else ChangeStatus.FAILED
        change.finished_at = timezone.now() - timedelta(seconds=1)
        change.save(update_fields=["status", "finished_at"])
        values = {"last_seen_at": timezone.now()}
        if ok:
            values.update(
                observed_mig_config=change.to_config["mig_config"] or "",
                observed_device_plugin_config=change.to_config["device_plugin_config"],
                config_state="success",
                agent_config_id=change.to_config["config_id"],
            )
        else:
            values.update(config_state="failed")
        Node.objects.filter(pk=change.node_id).update(**values)


def _step(rng: random.Random, at, pools, profiles) -> None:
    """One random edit, as any writer would make it (services, the admin, the watcher's bulk updates)."""
    nodes = list(Node.objects.order_by("pk"))
    node = rng.choice(nodes)
    action = rng.choice(
        ["pool_profile", "pin", "pin_until", "unpin", "window", "schedule_toggle", "observed", "stale", "fresh",
         "not_ready", "gpu", "pool_move", "profile_edit", "apply", "apply", "nothing"]
    )  # fmt: skip
    if action == "pool_profile":
        PoolSharing.objects.update_or_create(pool=rng.choice(pools), defaults={"profile": rng.choice(profiles)})
    elif action in ("pin", "pin_until"):
        until = at + timedelta(minutes=rng.randint(5, 600)) if action == "pin_until" else None
        NodePin.objects.update_or_create(node=node, defaults={"profile": rng.choice(profiles), "until": until})
    elif action == "unpin":
        NodePin.objects.filter(node=node).delete()
    elif action == "window":
        start = rng.randint(0, 23)
        ScheduleWindow.objects.update(start=time(start), end=time((start + rng.randint(1, 12)) % 24))
    elif action == "schedule_toggle":
        schedule = Schedule.objects.get()
        schedule.enabled = not schedule.enabled
        schedule.save()
    elif action == "observed":
        Node.objects.filter(pk=node.pk).update(
            observed_mig_config=rng.choice(["all-disabled", "all-1g.10gb", "custom"]),
            config_state=rng.choice(["success", "pending", "failed"]),
        )
    elif action == "stale":
        Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now() - timedelta(hours=1))
    elif action == "fresh":
        Node.objects.filter(last_seen_at__lt=timezone.now() - timedelta(minutes=1)).update(last_seen_at=timezone.now())
    elif action == "not_ready":
        Node.objects.filter(pk=node.pk).update(ready=not node.ready)
    elif action == "gpu":
        Gpu.objects.filter(node=node, index=1).update(gone_at=None if rng.random() < 0.5 else timezone.now())
    elif action == "pool_move":
        Node.objects.filter(pk=node.pk).update(pool=rng.choice([*pools, None]))
    elif action == "profile_edit":
        profile = SharingProfile.objects.get(name="mig-2")
        profile.mig_layouts = {"all": {rng.choice(["3g.40gb", "2g.20gb"]): 2}}
        profile.save()
    elif action == "apply":
        _apply_changes(rng)


@pytest.mark.parametrize("seed", range(3))
def test_the_incremental_tick_equals_a_full_evaluation_over_random_edits(small_fleet, seed):
    """After every step (an edit, pins and their ends, schedule window crossings, drift, staleness) the incremental
    tick leaves the drift a full evaluation finds at that instant, and leaves no node a full pass would plan."""
    _actor, _cluster, pools, profiles = small_fleet
    rng = random.Random(seed)
    at = MONDAY_6_UTC
    reconcile.reconcile(at=at)  # the first pass is full
    assert ReconcileState.objects.get().full_at == at
    evaluated = []
    for _ in range(30):
        _step(rng, at, pools, profiles)
        at += timedelta(minutes=rng.choice([1, 30, 90, 240, 600]))  # crossing 08:00 and 20:00 Berlin now and then
        rollouts_supersede(at=at)  # what the tick does first, so both see the same changes in flight
        expected = _full_drift(at)
        scope = reconcile.tick_scope(at=at)
        assert scope.full == any(ReconcileMark.objects.values_list("everything", flat=True))  # a profile edit
        evaluated.append(len(scope.node_ids) if not scope.full else None)
        reconcile.reconcile(at=at)
        assert dict(NodeDrift.objects.values_list("node_id", "reason")) == expected, f"seed {seed} at {at}"
        planned = [pk for pk, reason in _full_drift(at).items() if reason == "planned"]
        assert not planned, f"the incremental tick left nodes {planned} a full pass would plan (seed {seed})"
    assert ReconcileState.objects.get().missed == 0
    incremental = [n for n in evaluated if n is not None]
    assert len(incremental) > 15 and min(incremental) < 12, "the incremental tick evaluated every node every time"


def test_a_tick_with_nothing_changed_evaluates_no_node(small_fleet):
    reconcile.reconcile(at=MONDAY_6_UTC)
    for node in Node.objects.all():  # every node runs what it should: nothing is drifted
        Node.objects.filter(pk=node.pk).update(
            observed_mig_config="all-disabled", observed_device_plugin_config="", config_state="success"
        )
    NodeChange.objects.update(status=ChangeStatus.CANCELLED)
    PoolSharing.objects.all().delete()
    Schedule.objects.all().delete()
    reconcile.reconcile(at=MONDAY_6_UTC + timedelta(minutes=1))
    assert not NodeDrift.objects.exists() and not ReconcileMark.objects.exists()
    # The agents report (last-seen, metrics): no mark, no node to evaluate.
    Node.objects.update(last_seen_at=timezone.now(), agent_version="1.2.3")
    Gpu.objects.update(utilization_pct=50)
    scope = reconcile.tick_scope(at=MONDAY_6_UTC + timedelta(minutes=2))
    assert (scope.full, scope.node_ids) == (False, set())


def test_a_window_boundary_evaluates_the_pool_of_the_schedule_that_switches(small_fleet):
    _actor, _cluster, pools, _profiles = small_fleet
    reconcile.reconcile(at=MONDAY_6_UTC)
    NodeDrift.objects.all().delete()  # as if every node were in sync: what remains in scope is the boundary's
    NodePin.objects.all().delete()
    ReconcileMark.objects.all().delete()
    before = reconcile.tick_scope(at=MONDAY_6_UTC + timedelta(minutes=30))  # 07:30 in Berlin: no boundary
    crossing = reconcile.tick_scope(at=MONDAY_6_UTC + timedelta(hours=1, minutes=30))  # 08:30: the day began
    assert before.node_ids == set()
    assert crossing.node_ids == set(pools[0].nodes.values_list("pk", flat=True))


def test_a_pin_ending_is_a_boundary(small_fleet):
    _actor, _cluster, _pools, profiles = small_fleet
    node = Node.objects.order_by("pk").last()
    NodePin.objects.create(node=node, profile=profiles[1], until=MONDAY_6_UTC + timedelta(minutes=10))
    reconcile.reconcile(at=MONDAY_6_UTC)
    NodeDrift.objects.all().delete()
    assert reconcile.tick_scope(at=MONDAY_6_UTC + timedelta(minutes=5)).node_ids == set()
    assert reconcile.tick_scope(at=MONDAY_6_UTC + timedelta(minutes=15)).node_ids == {node.pk}


def test_a_node_back_from_stale_is_evaluated_again(small_fleet):
    node = Node.objects.order_by("pk").first()
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now() - timedelta(hours=1))
    reconcile.reconcile(at=MONDAY_6_UTC)
    assert node.pk in ReconcileState.objects.get().held
    NodeDrift.objects.all().delete()
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now())
    assert reconcile.tick_scope(at=MONDAY_6_UTC).node_ids == {node.pk}


def test_the_full_pass_counts_what_escaped_the_marks_and_metrics_show_it(small_fleet, settings, scrape):
    """A change that bypasses the triggers (here: marks deleted by hand) is found by the next full pass."""
    reconcile.reconcile(at=MONDAY_6_UTC)  # pool 0's four nodes get the schedule's baseline
    NodeChange.objects.update(status=ChangeStatus.CANCELLED)  # the nodes are free to be planned again
    NodeDrift.objects.all().delete()
    ReconcileMark.objects.all().delete()
    assert reconcile.reconcile(at=MONDAY_6_UTC + timedelta(minutes=1)) == []  # the incremental tick sees nothing
    settings.TESSERA = {**settings.TESSERA, "RECONCILE_FULL_SECONDS": 60}
    assert reconcile.reconcile(at=MONDAY_6_UTC + timedelta(minutes=2))  # the full pass plans them
    state = ReconcileState.objects.get()
    assert state.missed == 4 and state.full_at == MONDAY_6_UTC + timedelta(minutes=2)
    assert scrape()["tessera_reconcile_incremental_missed_total"][()] == 4


def test_every_watched_table_has_its_triggers(db):
    """SQLite drops a table's triggers when a migration rebuilds it: they are re-created after every migrate."""
    assert marks.installed(connection) == marks.expected()


def test_the_marks_cover_what_an_evaluation_reads(small_fleet):
    """Editing any input of desired_vs_observed marks its node, its pool or everything."""
    actor, cluster, pools, profiles = small_fleet
    node, other = Node.objects.order_by("pk")[:2]

    def marked(edit):
        ReconcileMark.objects.all().delete()
        edit()
        return set(ReconcileMark.objects.values_list("node_id", "pool_id", "everything"))

    assert marked(lambda: Node.objects.filter(pk=node.pk).update(observed_device_plugin_config="x")) == {
        (node.pk, None, False)
    }
    assert marked(lambda: Gpu.objects.filter(node=other, index=0).update(product="other")) == {(other.pk, None, False)}
    Gpu.objects.filter(node=other, index=0).update(product=H100)
    assert marked(lambda: sharing_services.pool_set_profile(actor=actor, pool=pools[1], profile=profiles[1])) == {
        (None, pools[1].pk, False)
    }
    assert marked(lambda: sharing_services.node_pin_profile(actor=actor, node=node, profile=profiles[2])) == {
        (node.pk, None, False)
    }
    assert marked(lambda: ScheduleWindow.objects.update(end=time(21))) == {(None, pools[0].pk, False)}
    assert (None, None, True) in marked(
        lambda: sharing_services.profile_update(actor=actor, profile=profiles[1], mig_layouts={"all": {"2g.20gb": 3}})
    )
    assert marked(lambda: Cluster.objects.filter(pk=cluster.pk).update(mig_strategy="mixed")) == {(None, None, True)}
    # What every report writes marks nothing.
    assert marked(lambda: Node.objects.update(last_seen_at=timezone.now(), agent_version="9")) == set()


def test_the_calendars_read_as_tuples_are_the_schedules_own(small_fleet):
    """The tick reads every calendar as tuples (scheduling.selectors.enabled_calendars): the same as to_calendar()."""
    schedule = Schedule.objects.get()
    schedule.exceptions.create(date=datetime(2026, 12, 24).date())
    ScheduleWindow.objects.create(
        schedule=schedule, name="night", weekdays=[5], start=time(22), end=time(6), profile=small_fleet[3][1]
    )
    assert enabled_calendars() == {schedule.pool_id: schedule.to_calendar()}
    Schedule.objects.update(enabled=False)
    assert enabled_calendars() == {}


def test_the_tick_sends_the_full_pass_once_and_never_runs_it_itself(small_fleet, monkeypatch):
    """At 100,000 nodes a full pass takes longer than a tick may: the tick sends it as its own task, once."""
    sent = []
    monkeypatch.setattr(tasks.reconcile_full, "apply_async", lambda **options: sent.append(options))
    tasks.reconcile_tick()
    assert len(sent) == 1 and not Rollout.objects.exists()  # no full pass yet: the tick could evaluate nothing
    tasks.reconcile_tick()
    assert len(sent) == 1  # the request stands until the pass answers it
    tasks.reconcile_full()
    assert Rollout.objects.exists() and ReconcileState.objects.get().full_requested_at is None
    tasks.reconcile_tick()
    assert len(sent) == 1  # not due again before RECONCILE_FULL_SECONDS
