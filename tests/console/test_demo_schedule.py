"""The demo schedule of `make run` (console/demo_schedule.py): plain schedule windows at a demo-only pace, on idle
MIG-capable nodes of the simulated cluster, kept ahead as time passes, switched off on request."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from kubernetes import client

from console import demo_schedule as demo
from core.models import AuditEvent
from fleet.labels import parse_selector
from scheduling import windows
from scheduling.models import Schedule
from worker.drivers.kubernetes.labels import pod_gpu_resources

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
    assert demo.demo_schedule_extend(sim_cluster.pk) is False  # a disabled schedule is not extended
    demo.demo_schedule_seed(sim_cluster)
    assert Schedule.objects.get(pool__name=demo.POOL).enabled is True
