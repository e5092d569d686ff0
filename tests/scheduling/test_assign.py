"""Assigning a profile to a pool while its schedule sets the pool's profile: the schedule's hold explained (what,
until when, when the default applies), the three modes (default, window, pin until the next transition) through
the service and the API, pins that end, and "roll out now" refused with the reason."""

from datetime import UTC, datetime, time, timedelta

import pytest
import time_machine

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from fleet import services as fleet_services
from fleet.models import Node
from scheduling import services
from scheduling.assign import AssignMode, pool_assign, schedule_rule
from scheduling.models import Schedule
from scheduling.selectors import desired_state
from sharing import services as sharing_services
from sharing.models import NodePin, PoolSharing
from tests.factories import ClusterFactory, NodePoolFactory
from tests.worker.test_engine import H100, _observation
from worker.rollouts import pool_assign_and_roll_out

pytestmark = pytest.mark.django_db

MONDAY_NOON = datetime(2026, 3, 30, 10, 0, tzinfo=UTC)  # 12:00 CEST, inside the 08:00–20:00 window
MONDAY_NIGHT = datetime(2026, 3, 30, 20, 0, tzinfo=UTC)  # 22:00 CEST


@pytest.fixture
def setup(admin_user):
    actor = Actor.for_user(admin_user)
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster, name="inference")
    fleet_services.inventory_record(cluster=cluster, nodes=[_observation(f"n{i}", dp="whole") for i in range(3)])
    Node.objects.update(pool=pool)
    day = sharing_services.profile_create(
        actor=actor, name="mig-day", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    sliced = sharing_services.profile_create(
        actor=actor, name="ts-4", mode="time_slicing", target_products=[H100], replicas=4
    )
    services.schedule_create(
        actor=actor,
        pool=pool,
        name="day-night",
        time_zone="Europe/Berlin",
        windows=[{"name": "day", "weekdays": [0, 1, 2, 3, 4], "start": time(8), "end": time(20), "profile": day}],
    )
    return actor, pool, day, whole, sliced


def test_the_rule_says_what_the_schedule_sets_until_when_and_when_the_default_applies(setup):
    _, pool, day, _, _ = setup
    rule = schedule_rule(pool, at=MONDAY_NOON)
    assert (rule.profile, rule.window.name, rule.until) == (day, "day", datetime(2026, 3, 30, 18, 0, tzinfo=UTC))
    assert rule.default_from == rule.until
    assert rule.message == (
        "The schedule day-night sets mig-day (window day (Mon–Fri 08:00–20:00)) until 20:00 CEST; your profile "
        "applies from then."
    )
    assert schedule_rule(pool, at=MONDAY_NIGHT) is None  # outside the window the pool's default applies


def test_with_a_baseline_the_rule_says_the_default_never_applies(setup):
    actor, pool, _, whole, _ = setup
    schedule = Schedule.objects.get()
    services.schedule_update(actor=actor, schedule=schedule, baseline_profile=whole)
    rule = schedule_rule(pool, at=MONDAY_NOON)
    assert rule.default_from is None and rule.next_profile == whole
    assert "at no time in the next 8 days" in rule.message
    night = schedule_rule(pool, at=MONDAY_NIGHT)
    assert (night.profile, night.window, night.part) == (whole, None, "its baseline")
    assert night.until == datetime(2026, 3, 31, 6, 0, tzinfo=UTC)


def test_default_mode_sets_the_default_and_says_when_it_applies(setup):
    actor, pool, day, _, sliced = setup
    assignment = pool_assign(actor=actor, pool=pool, profile=sliced, at=MONDAY_NOON)
    assert PoolSharing.objects.get(pool=pool).profile == sliced
    assert assignment.applies_from == datetime(2026, 3, 30, 18, 0, tzinfo=UTC)
    assert "your profile applies from then" in assignment.message
    node = Node.objects.first()
    assert desired_state(node, at=MONDAY_NOON).profile == day
    assert desired_state(node, at=MONDAY_NIGHT).profile == sliced


def test_window_mode_replaces_the_profile_of_the_window_in_force(setup):
    actor, pool, _, _, sliced = setup
    assignment = pool_assign(actor=actor, pool=pool, profile=sliced, mode=AssignMode.WINDOW, at=MONDAY_NOON)
    assert assignment.message.startswith("Window day (Mon–Fri 08:00–20:00) of schedule day-night now sets ts-4")
    (window,) = Schedule.objects.get().windows.all()
    assert (window.name, window.profile, window.start) == ("day", sliced, time(8))
    assert desired_state(Node.objects.first(), at=MONDAY_NOON).profile == sliced
    event = AuditEvent.objects.filter(action="schedule.update").get()
    assert event.before["windows"][0]["profile"] == "mig-day" and event.after["windows"][0]["profile"] == "ts-4"
    assert not PoolSharing.objects.filter(pool=pool).exists()  # the default is left alone


def test_window_mode_on_the_baseline_changes_the_baseline(setup):
    actor, pool, _, whole, sliced = setup
    services.schedule_update(actor=actor, schedule=Schedule.objects.get(), baseline_profile=whole)
    pool_assign(actor=actor, pool=pool, profile=sliced, mode=AssignMode.WINDOW, at=MONDAY_NIGHT)
    assert Schedule.objects.get().baseline_profile == sliced


def test_window_mode_needs_an_admin(setup, operator):
    _, pool, _, _, sliced = setup
    with pytest.raises(ApplicationError) as refused:
        pool_assign(actor=Actor.for_user(operator), pool=pool, profile=sliced, mode=AssignMode.WINDOW, at=MONDAY_NOON)
    assert refused.value.status == 403 and "admin" in refused.value.errors["mode"][0]


def test_pin_mode_pins_until_the_next_transition_and_the_pins_end_there(setup):
    actor, pool, day, whole, sliced = setup
    kept = Node.objects.get(name="n2")
    sharing_services.node_pin_profile(actor=actor, node=kept, profile=whole, reason="long job")
    with time_machine.travel(MONDAY_NOON, tick=False):
        assignment = pool_assign(actor=actor, pool=pool, profile=sliced, mode=AssignMode.PIN)
    end = datetime(2026, 3, 30, 18, 0, tzinfo=UTC)
    assert (assignment.pins, assignment.pinned_until) == (2, end)
    assert "2 nodes of pool inference pinned to ts-4 until 20:00 CEST" in assignment.message
    assert "1 node with a pin of their own keep it" in assignment.message
    pins = NodePin.objects.filter(profile=sliced)
    assert sorted(pins.values_list("node__name", flat=True)) == ["n0", "n1"] and {p.until for p in pins} == {end}
    assert NodePin.objects.get(node=kept).profile == whole  # an existing pin is not overwritten
    node = Node.objects.get(name="n0")
    assert desired_state(node, at=end - timedelta(minutes=1)).profile == sliced
    # Past its end a pin no longer counts, whether or not the tick has removed it yet; the tick removes it.
    assert desired_state(node, at=end).profile is None  # the window is over and the pool has no default
    assert sharing_services.pins_expire(now=end) == 2
    assert NodePin.objects.count() == 1
    events = AuditEvent.objects.filter(action="node.unpin")
    assert events.count() == 2 and {e.actor_label for e in events} == {"pin expiry"}
    assert events.first().before["until"] == end.isoformat()


def test_modes_other_than_default_need_the_schedule_to_rule(setup):
    actor, pool, _, _, sliced = setup
    for mode in (AssignMode.WINDOW, AssignMode.PIN):
        with pytest.raises(ApplicationError) as refused:
            pool_assign(actor=actor, pool=pool, profile=sliced, mode=mode, at=MONDAY_NIGHT)
        assert "No schedule sets pool inference's profile now" in refused.value.errors["mode"][0]


@time_machine.travel(MONDAY_NOON, tick=False)
def test_roll_out_now_of_a_new_default_is_refused_with_the_schedules_reason(setup):
    actor, pool, _, _, sliced = setup
    with pytest.raises(ApplicationError) as refused:
        pool_assign_and_roll_out(actor=actor, pool=pool, profile=sliced, strategy={"batch_size": 1})
    message = refused.value.errors["rollout_now"][0]
    assert message.startswith("Nothing to roll out now: The schedule day-night sets mig-day")
    assert message.endswith("change the schedule's profile or pin the nodes until 20:00 CEST.")


@time_machine.travel(MONDAY_NOON, tick=False)
def test_the_api_previews_and_assigns_in_each_mode(setup, operator_api, admin_api):
    _, pool, day, _, sliced = setup
    preview = operator_api.post(f"/api/v1/profiles/{sliced.pk}/preview/", {"pool": pool.pk}, format="json")
    assert preview.status_code == 200
    schedule = preview.json()["schedule"]
    assert (schedule["profile"]["name"], schedule["window"], schedule["until"]) == (
        "mig-day",
        "day",
        "2026-03-30T18:00:00Z",
    )
    assert schedule["message"].endswith("until 20:00 CEST; your profile applies from then.")

    url = f"/api/v1/profiles/{sliced.pk}/assign/"
    default = operator_api.post(url, {"pool": pool.pk}, format="json")
    assert default.status_code == 200, default.json()
    body = default.json()
    assert body["name"] == "ts-4" and body["assignment"]["mode"] == "default"
    assert body["assignment"]["applies_from"] == "2026-03-30T18:00:00Z"
    assert body["assignment"]["schedule"]["schedule"]["name"] == "day-night"

    refused = operator_api.post(url, {"pool": pool.pk, "mode": "window"}, format="json")
    assert refused.status_code == 403
    assert refused.json() == {
        "message": "Changing a schedule needs the admin role.",
        "errors": {"mode": ["Changing a schedule needs the admin role."]},
    }
    bad = operator_api.post(url, {"pool": pool.pk, "mode": "later"}, format="json")
    assert bad.status_code == 400 and "mode" in bad.json()["errors"]

    pinned = operator_api.post(url, {"pool": pool.pk, "mode": "pin_until_next_transition"}, format="json")
    assert pinned.status_code == 200
    assert (pinned.json()["assignment"]["pins"], pinned.json()["assignment"]["pinned_until"]) == (
        3,
        "2026-03-30T18:00:00Z",
    )
    pins = operator_api.get("/api/v1/node-pins/").json()["results"]
    assert {p["until"] for p in pins} == {"2026-03-30T18:00:00Z"}

    window = admin_api.post(url, {"pool": pool.pk, "mode": "window"}, format="json")
    assert window.status_code == 200 and window.json()["assignment"]["applies_from"] == "2026-03-30T10:00:00Z"
    assert Schedule.objects.get().windows.get().profile == sliced
    actions = list(AuditEvent.objects.order_by("pk").values_list("action", flat=True))
    assert actions[-5:] == ["pool.set_profile", "node.pin", "node.pin", "node.pin", "schedule.update"]


def test_the_pin_endpoint_takes_an_end(setup, operator_api):
    _, _, _, whole, _ = setup
    node = Node.objects.first()
    url = f"/api/v1/profiles/{whole.pk}/pin/"
    past = operator_api.post(url, {"nodes": [node.pk], "until": "2020-01-01T00:00:00Z"}, format="json")
    assert past.status_code == 400 and past.json()["errors"] == {"until": ["Give an instant in the future."]}
    ok = operator_api.post(url, {"nodes": [node.pk], "until": "2099-01-01T00:00:00Z"}, format="json")
    assert ok.status_code == 200 and ok.json()[0]["until"] == "2099-01-01T00:00:00Z"
