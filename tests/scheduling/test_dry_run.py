"""Saving a schedule or the day/night preset with `dry_run`: the impact (nodes, GPU resets, pods losing their slice,
when) and nothing written — no schedule, no audit event, no rollout, nothing for the reconcile loop to follow."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from core.models import AuditEvent
from fleet.models import Pod
from scheduling import services
from scheduling.models import Schedule
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory
from worker.models import Rollout
from worker.reconcile import reconcile

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"
EVERY_DAY = [0, 1, 2, 3, 4, 5, 6]


@pytest.fixture
def pool():
    """Three nodes of two whole H100s each (MIG off), one pod holding a whole GPU on the first."""
    pool = NodePoolFactory(name="inference", cluster=ClusterFactory(name="east"))
    for i in range(3):
        node = NodeFactory(cluster=pool.cluster, pool=pool, name=f"inf-{i}", allocatable={"nvidia.com/gpu": 2})
        for index in range(2):
            GpuFactory(node=node, index=index, mig_enabled=False)
        if i == 0:
            Pod.objects.create(
                node=node,
                namespace="ml",
                name="trainer",
                gpu_resources={"nvidia.com/gpu": 1},
                observed_at=timezone.now(),
            )
    return pool


def day_now(pool, profiles, **extra) -> dict:
    """A preset whose day window runs now (UTC) and ends in two hours."""
    mig, whole = profiles
    now = datetime.now(UTC)
    return {
        "pool": pool.pk,
        "day_profile": mig.pk,
        "night_profile": whole.pk,
        "time_zone": "UTC",
        "day_start": (now - timedelta(hours=1)).strftime("%H:%M"),
        "day_end": (now + timedelta(hours=2)).strftime("%H:%M"),
        "weekdays": EVERY_DAY,
        **extra,
    }


def nothing_written(audit_count: int) -> bool:
    return not Schedule.objects.exists() and AuditEvent.objects.count() == audit_count and not Rollout.objects.exists()


@pytest.mark.parametrize("how", ["query", "body"])
def test_day_night_dry_run_answers_the_impact_and_writes_nothing(admin_api, pool, profiles, how):
    audit_count = AuditEvent.objects.count()
    body = day_now(pool, profiles, **({"dry_run": True} if how == "body" else {}))
    url = "/api/v1/schedules/day-night/" + ("?dry_run=true" if how == "query" else "")
    response = admin_api.post(url, body, format="json")
    assert response.status_code == 200, response.json()
    answer = response.json()
    assert answer["dry_run"] is True
    at_once, switch = answer["impact"]
    assert (at_once["when"], at_once["profile"]["name"]) == ("now", "mig-7")
    # MIG mode goes on for every GPU: 6 resets on 3 nodes; the pod holding a whole GPU loses it.
    assert at_once["summary"] == {
        "nodes": 3,
        "changing": 3,
        "refused": 0,
        "resetting": 3,
        "pods_losing": 1,
        "gpus_resetting": 6,
    }
    losing = [n for n in at_once["nodes"] if n["pods_losing"]]
    assert [(n["node"]["name"], n["pods_losing"][0]["name"], n["reset_gpus"]) for n in losing] == [
        ("inf-0", "trainer", [0, 1])
    ]
    assert (switch["when"], switch["profile"]["name"]) == ("transition", "whole")
    expected = datetime.now(UTC) + timedelta(hours=2)
    assert abs(datetime.fromisoformat(switch["at"]) - expected) < timedelta(minutes=2)

    assert nothing_written(audit_count)
    assert reconcile() == [] and not Rollout.objects.exists()  # nothing for the loop to act on either


def test_without_dry_run_the_preset_is_created(admin_api, pool, profiles):
    response = admin_api.post("/api/v1/schedules/day-night/", day_now(pool, profiles), format="json")
    assert response.status_code == 201 and Schedule.objects.get().name == "inference day/night"


def test_dry_run_is_checked_like_a_save(admin_api, pool, profiles):
    audit_count = AuditEvent.objects.count()
    bad = admin_api.post("/api/v1/schedules/day-night/?dry_run=1", day_now(pool, profiles, weekdays=[]), format="json")
    assert bad.status_code == 400 and "weekdays" in bad.json()["errors"]
    assert nothing_written(audit_count)


def test_schedule_create_and_update_dry_run(admin_api, actor, pool, profiles):
    mig, whole = profiles
    audit_count = AuditEvent.objects.count()
    body = {
        "pool": pool.pk,
        "name": "nights whole",
        "time_zone": "UTC",
        "baseline_profile": whole.pk,
        "windows": [{"name": "day", "weekdays": [0], "start": "08:00", "end": "09:00", "profile": mig.pk}],
        "dry_run": True,
    }
    created = admin_api.post("/api/v1/schedules/", body, format="json")
    assert created.status_code == 200 and created.json()["dry_run"] is True
    assert nothing_written(audit_count)

    schedule = services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=mig, night_profile=whole, time_zone="UTC", weekdays=[0]
    )
    before = (Schedule.objects.get().updated_at, AuditEvent.objects.count())
    patched = admin_api.patch(
        f"/api/v1/schedules/{schedule.pk}/?dry_run=true", {"enabled": False}, format="json"
    ).json()
    assert patched == {"dry_run": True, "impact": []}  # disabled: the pool keeps its defaults
    patched = admin_api.patch(f"/api/v1/schedules/{schedule.pk}/", {"name": "x", "dry_run": True}, format="json")
    assert patched.status_code == 200 and [c["when"] for c in patched.json()["impact"]] == ["now", "transition"]
    schedule.refresh_from_db()
    assert (schedule.name, schedule.enabled) == ("inference day/night", True)
    assert (Schedule.objects.get().updated_at, AuditEvent.objects.count()) == before


def test_dry_run_is_in_the_schema(admin_api):
    schema = admin_api.get("/api/schema/?format=json").json()
    day_night = schema["paths"]["/api/v1/schedules/day-night/"]["post"]
    assert "dry_run" in {p["name"] for p in day_night["parameters"]}
    create = schema["paths"]["/api/v1/schedules/"]["post"]
    assert "dry_run" in {p["name"] for p in create["parameters"]}
    assert "200" in create["responses"] and "201" in create["responses"]
