"""The demo schedule of `make run` (console/demo_schedule.py): plain schedule windows at a demo-only pace, on idle
MIG-capable nodes of the simulated cluster, kept ahead as time passes, switched off on request."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from kubernetes import client

from console import demo_schedule as demo
from core.models import AuditEvent
from fleet import services as fleet_services
from fleet.labels import parse_selector
from scheduling import windows
from scheduling.models import KueueBinding, Schedule
from tests.integration.test_rollout_faults import drive
from worker import reconcile
from worker.drivers import driver_for
from worker.drivers.kubernetes.labels import pod_gpu_resources
from worker.inventory.cluster import sync_cluster_full
from worker.kueue import kueue_sync
from worker.models import Rollout

UTC_ZONE = ZoneInfo("UTC")


def _calendar(rows) -> windows.Calendar:
    return windows.Calendar(
        tz="UTC", windows=tuple(windows.Window({d}, s, e, "day") for d, s, e in rows), baseline="night"
    )


def test_pace_windows_turn_over_every_two_minutes_on_the_wall_clock_for_the_coming_hour():
    now = datetime(2026, 11, 29, 8, 5, 30, tzinfo=UTC)  # a Sunday, inside the window 08:04–08:06
    rows = demo.pace_windows(now, UTC_ZONE)
    assert rows[0] == (6, datetime(2026, 1, 1, 8, 4).time(), datetime(2026, 1, 1, 8, 6).time())
    assert len(rows) == 16  # 08:04, 08:08 … 09:04
    calendar = _calendar(rows)
    values = [windows.value_at(calendar, now + timedelta(minutes=2 * k)) for k in range(6)]
    assert values == ["day", "night"] * 3
    changes = windows.transitions(calendar, now, now + demo.HORIZON)
    assert changes[0].at == datetime(2026, 11, 29, 8, 6, tzinfo=UTC)
    assert {b.at - a.at for a, b in zip(changes, changes[1:], strict=False)} == {timedelta(minutes=2)}


def test_pace_windows_cross_midnight_into_the_next_weekday():
    rows = demo.pace_windows(datetime(2026, 11, 29, 23, 57, tzinfo=UTC), UTC_ZONE)  # Sunday
    assert rows[:2] == [
        (6, datetime(2026, 1, 1, 23, 56).time(), datetime(2026, 1, 1, 23, 58).time()),
        (0, datetime(2026, 1, 1, 0, 0).time(), datetime(2026, 1, 1, 0, 2).time()),
    ]
    windows.check(_calendar(rows))  # no overlap on the weekly circle


@pytest.fixture
def sim_options():
    return {"workload_pods": 8}  # pods holding GPUs on some nodes: those are never picked


@pytest.mark.django_db
def test_the_demo_pool_takes_idle_mig_nodes_and_its_schedule_switches_every_two_minutes(sim, core, sim_cluster):
    line = demo.demo_schedule_seed(sim_cluster)
    assert line.startswith(f"Demo schedule: pool {demo.POOL} switches between")
    schedule = Schedule.objects.select_related("pool", "baseline_profile").get(pool__name=demo.POOL)
    assert "demo pace" in schedule.name and "make run --no-demo-schedule" in schedule.pool.description
    ((requirement,),) = [parse_selector(schedule.pool.node_selector)]
    assert requirement.key == "kubernetes.io/hostname" and len(requirement.values) == demo.NODES
    pods = core.list_pod_for_all_namespaces().items
    busy = {p.spec.node_name for p in pods if pod_gpu_resources(client.ApiClient().sanitize_for_serialization(p))}
    assert busy and not busy & requirement.values
    products = {core.read_node(name).metadata.labels["nvidia.com/gpu.product"] for name in requirement.values}
    assert len(products) == 1 and schedule.baseline_profile.name == demo.NIGHT_PROFILE

    now = timezone.now()
    calendar = schedule.to_calendar()
    changes = windows.transitions(calendar, now, now + timedelta(minutes=30))
    assert len(changes) >= 14 and {b.at - a.at for a, b in zip(changes, changes[1:], strict=False)} == {
        timedelta(minutes=2)
    }
    audited = AuditEvent.objects.count()
    demo.demo_schedule_seed(sim_cluster)  # a restart of make run: nothing new
    assert AuditEvent.objects.count() == audited

    look = demo.first_look(now)  # what the overview points at
    assert look["pool"] == schedule.pool and look["next_at"] == changes[0].at
    assert look["next_profile"].pk == changes[0].to_value[0]
    assert f"get nodes -l '{schedule.pool.node_selector}' -L {demo.MIG_LABELS} -w" in look["kubectl"]


@pytest.mark.django_db
def test_the_demo_pool_is_bound_to_a_cluster_queue_whose_quota_follows_its_layout(sim, custom, sim_cluster):
    demo.demo_schedule_seed(sim_cluster)
    binding = KueueBinding.objects.get(pool__name=demo.POOL)
    assert (binding.cluster_queues, binding.lead_minutes) == ([demo.CLUSTER_QUEUE], demo.KUEUE_LEAD_MINUTES)
    driver_for(sim_cluster).adopt_operator_configs()  # as make run does
    sync_cluster_full(sim_cluster)  # the watcher's view of the nodes, then the pool's members
    fleet_services.pool_apply_selector(pool=binding.pool)
    assert binding.pool.nodes.count() == demo.NODES
    calendar = Schedule.objects.get(pool=binding.pool).to_calendar()
    now = timezone.now()
    # Just after the last switch (more than the lead time before the next one), with the nodes switched.
    at = windows.transitions(calendar, now - timedelta(minutes=5), now)[-1].at + timedelta(seconds=1)
    (rollout_id,) = reconcile.reconcile(at=at)
    assert drive(Rollout.objects.get(pk=rollout_id), sim).status == "succeeded"
    sync_cluster_full(sim_cluster)
    assert kueue_sync(binding.pool_id, at=at) == {demo.CLUSTER_QUEUE: "written"}
    queue = custom.get_cluster_custom_object(demo.KUEUE_GROUP, demo.KUEUE_VERSION, "clusterqueues", demo.CLUSTER_QUEUE)
    (group,) = queue["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    assert flavor["name"].startswith(f"tessera-{demo.POOL}-")
    quota = {r["name"]: r["nominalQuota"] for r in flavor["resources"]}
    day = windows.value_at(calendar, at) != calendar.baseline
    wanted = {"nvidia.com/mig-1g.10gb": "168"} if day else {"nvidia.com/gpu": "24"}  # 3 H100 nodes × 8 GPUs
    assert {k: v for k, v in quota.items() if v != "0"} == wanted


@pytest.mark.django_db
def test_the_windows_are_written_again_before_they_run_out_and_the_one_in_force_stays(sim, sim_cluster):
    demo.demo_schedule_seed(sim_cluster)
    schedule = Schedule.objects.get(pool__name=demo.POOL)
    start = timezone.now()
    assert demo.demo_schedule_extend(sim_cluster.pk, now=start + timedelta(minutes=10)) is False  # 50 min left
    later = start + timedelta(minutes=40, seconds=30)
    before = windows.value_at(schedule.to_calendar(), later)
    assert demo.demo_schedule_extend(sim_cluster.pk, now=later) is True
    schedule.refresh_from_db()
    calendar = schedule.to_calendar()
    assert windows.value_at(calendar, later) == before
    assert windows.transitions(calendar, later, later + demo.HORIZON)[-1].at - later > timedelta(minutes=55)
    assert AuditEvent.objects.filter(action="schedule.update", actor_label=demo.ACTOR.label).count() == 1


@pytest.mark.django_db
def test_no_demo_schedule_switches_it_off_and_a_normal_start_back_on(sim, sim_cluster):
    assert demo.demo_schedule_seed(sim_cluster, enabled=False) == "Demo schedule: off (--no-demo-schedule)"
    assert not Schedule.objects.exists()  # never made when off from the start
    demo.demo_schedule_seed(sim_cluster)
    demo.demo_schedule_seed(sim_cluster, enabled=False)
    assert Schedule.objects.get(pool__name=demo.POOL).enabled is False
    assert KueueBinding.objects.get(pool__name=demo.POOL).enabled is False
    assert demo.demo_schedule_extend(sim_cluster.pk) is False  # a disabled schedule is not extended
    demo.demo_schedule_seed(sim_cluster)
    assert Schedule.objects.get(pool__name=demo.POOL).enabled is True
    assert KueueBinding.objects.get(pool__name=demo.POOL).enabled is True
