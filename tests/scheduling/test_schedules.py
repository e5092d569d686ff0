"""Schedules in the database: validation, the day/night preset, desired state over time, catch-up after
downtime, rollouts triggered by a schedule, and the transitions API across 2026's DST changes."""

from datetime import UTC, datetime, time

import pytest

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet import services as fleet_services
from fleet.models import Node
from scheduling import services
from scheduling.selectors import desired_state, upcoming_transitions
from sharing import services as sharing_services
from tests.factories import ClusterFactory, NodePoolFactory
from tests.worker.test_engine import H100, _observation
from worker import reconcile
from worker.models import Rollout

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup(admin_user):
    actor = Actor.for_user(admin_user)
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster, name="inference")
    fleet_services.inventory_record(cluster=cluster, nodes=[_observation(f"n{i}", dp="whole") for i in range(3)])
    Node.objects.update(pool=pool)
    day = sharing_services.profile_create(
        actor=actor, name="day-mig", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    night = sharing_services.profile_create(actor=actor, name="night-whole", mode="passthrough", target_products=[H100])
    return actor, pool, day, night


def _day_night(actor, pool, day, night, tz="Europe/Berlin"):
    return services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=day, night_profile=night, time_zone=tz, busy_policy="drain"
    )


def test_day_night_preset_drives_desired_state_at_local_times(setup):
    actor, pool, day, night = setup
    _day_night(actor, pool, day, night)
    node = Node.objects.first()
    # Friday 2026-03-27 (CET, UTC+1) and Monday 2026-03-30 (CEST, UTC+2): 08:00 local on both sides of DST.
    assert desired_state(node, at=datetime(2026, 3, 27, 6, 59, tzinfo=UTC)).profile == night
    assert desired_state(node, at=datetime(2026, 3, 27, 7, 0, tzinfo=UTC)).profile == day
    assert desired_state(node, at=datetime(2026, 3, 30, 5, 59, tzinfo=UTC)).profile == night
    state = desired_state(node, at=datetime(2026, 3, 30, 6, 0, tzinfo=UTC))
    assert (state.profile, state.source) == (day, "schedule")
    assert desired_state(node, at=datetime(2026, 3, 28, 12, 0, tzinfo=UTC)).profile == night  # Saturday


def test_day_night_preset_switches_the_qos_policy_with_the_profile(setup, admin_api):
    actor, pool, day, night = setup
    inference = sharing_services.qos_policy_create(actor=actor, name="inference", transparent_hugepages="never")
    training = sharing_services.qos_policy_create(actor=actor, name="training", transparent_hugepages="always")
    body = {"pool": pool.pk, "day_profile": day.pk, "night_profile": night.pk, "time_zone": "UTC"}
    bad = admin_api.post("/api/v1/schedules/day-night/", {**body, "day_qos_policy": 999999}, format="json")
    assert bad.status_code == 400 and "day_qos_policy" in bad.json()["errors"]
    created = admin_api.post(
        "/api/v1/schedules/day-night/",
        {**body, "day_qos_policy": inference.pk, "night_qos_policy": training.pk},
        format="json",
    )
    assert created.status_code == 201, created.json()
    node = Node.objects.first()
    monday = datetime(2026, 3, 30, 12, 0, tzinfo=UTC)
    assert (desired_state(node, at=monday).profile, desired_state(node, at=monday).qos_policy) == (day, inference)
    sunday = datetime(2026, 3, 29, 12, 0, tzinfo=UTC)
    assert (desired_state(node, at=sunday).profile, desired_state(node, at=sunday).qos_policy) == (night, training)


def test_pin_beats_schedule_and_disabled_schedule_falls_back_to_pool_default(setup):
    actor, pool, day, night = setup
    schedule = _day_night(actor, pool, day, night)
    node = Node.objects.first()
    monday_noon = datetime(2026, 3, 30, 10, 0, tzinfo=UTC)
    sharing_services.node_pin_profile(actor=actor, node=node, profile=night)
    assert desired_state(node, at=monday_noon).source == "pin"
    other = Node.objects.exclude(pk=node.pk).first()
    services.schedule_update(actor=actor, schedule=schedule, enabled=False)
    assert desired_state(other, at=monday_noon).profile is None
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=night)
    assert desired_state(other, at=monday_noon).source == "pool"


def test_overlapping_windows_and_bad_zone_are_refused(setup):
    actor, pool, day, night = setup
    windows = [
        {"name": "a", "weekdays": [0], "start": time(8), "end": time(12), "profile": day},
        {"name": "b", "weekdays": [0], "start": time(11), "end": time(14), "profile": night},
    ]
    with pytest.raises(ApplicationError) as err:
        services.schedule_create(actor=actor, pool=pool, name="s", time_zone="Europe/Berlin", windows=windows)
    assert "overlap" in err.value.errors["windows"][0]
    with pytest.raises(ApplicationError) as err:
        services.schedule_create(actor=actor, pool=pool, name="s", time_zone="Mars/Olympus", windows=windows[:1])
    assert "time_zone" in err.value.errors


def test_catch_up_after_downtime_goes_straight_to_now_and_uses_schedule_policy(setup):
    actor, pool, day, night = setup
    _day_night(actor, pool, day, night)
    # Beat was down from Monday 19:00 to Tuesday 10:00 (missing 20:00 and 08:00): one pass, straight to "day".
    (rollout_id,) = reconcile.reconcile(at=datetime(2026, 3, 31, 8, 0, tzinfo=UTC))
    rollout = Rollout.objects.get(pk=rollout_id)
    assert (rollout.profile, rollout.trigger, rollout.busy_policy) == (day, "schedule", "drain")
    assert rollout.actor_label == "inference day/night"
    assert Rollout.objects.count() == 1


def test_transitions_api_across_dst_and_fleet_upcoming(setup, viewer_api, admin_api):
    actor, pool, day, night = setup
    schedule = _day_night(actor, pool, day, night, tz="America/New_York")
    response = viewer_api.get(
        f"/api/v1/schedules/{schedule.pk}/transitions/",
        {"start": "2026-10-30T00:00:00Z", "end": "2026-11-03T00:00:00Z"},
    )
    assert response.status_code == 200
    items = [(t["at"], t["local"], t["to_profile"]["name"]) for t in response.json()["results"]]
    assert items == [
        ("2026-10-30T12:00:00Z", "2026-10-30T08:00:00-04:00", "day-mig"),
        ("2026-10-31T00:00:00Z", "2026-10-30T20:00:00-04:00", "night-whole"),
        ("2026-11-02T13:00:00Z", "2026-11-02T08:00:00-05:00", "day-mig"),
    ]
    bad = viewer_api.get(
        f"/api/v1/schedules/{schedule.pk}/transitions/",
        {"start": "2026-11-03T00:00:00Z", "end": "2026-11-01T00:00:00Z"},
    )
    assert bad.status_code == 400 and "end" in bad.json()["errors"]
    upcoming = upcoming_transitions(hours=72, now=datetime(2026, 10, 30, 0, 0, tzinfo=UTC))
    assert [t.nodes for t in upcoming] == [3, 3]
    assert viewer_api.get("/api/v1/transitions/", {"hours": 48}).status_code == 200


def test_schedule_api_crud_and_roles(setup, admin_api, operator_api):
    _, pool, day, night = setup
    body = {
        "pool": pool.pk,
        "name": "inference hours",
        "time_zone": "Europe/Berlin",
        "baseline_profile": night.pk,
        "windows": [{"name": "day", "weekdays": [0, 1, 2, 3, 4], "start": "08:00", "end": "20:00", "profile": day.pk}],
        "exceptions": [{"date": "2026-12-25", "note": "Christmas"}],
    }
    assert operator_api.post("/api/v1/schedules/", body, format="json").status_code == 403
    created = admin_api.post("/api/v1/schedules/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["windows"][0]["profile"]["name"] == "day-mig"
    overlap = {
        **body,
        "windows": [*body["windows"], {**body["windows"][0], "name": "x", "start": "19:00", "end": "21:00"}],
    }
    bad = admin_api.put(f"/api/v1/schedules/{created.json()['id']}/", overlap, format="json")
    assert bad.status_code == 400 and "overlap" in bad.json()["errors"]["windows"][0]
    dup = admin_api.post(
        "/api/v1/schedules/day-night/",
        {"pool": pool.pk, "day_profile": day.pk, "night_profile": night.pk, "time_zone": "UTC"},
        format="json",
    )
    assert dup.status_code == 409
