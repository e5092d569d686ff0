"""Rollout and audit API: start with a strategy, follow progress, steer, role checks, query bounds."""

import pytest

from core.audit import Actor
from core.models import AuditEvent
from sharing import services as sharing_services
from tests.worker.conftest import mig_pool
from tests.worker.test_engine import H100, _fail_canary
from worker import reconcile, rollouts, services
from worker.models import NodeChange, Rollout

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(admin_user):
    """Four agent nodes with a MIG profile assigned to their pool (tests/worker/conftest.py)."""
    return mig_pool(admin_user, 4)[1]


def test_operator_starts_follows_and_steers_a_rollout(pool, operator_api, viewer_api, django_assert_max_num_queries):
    body = {"pool": pool.pk, "batch_size": 2, "canary_count": 1, "busy_policy": "drain"}
    assert viewer_api.post("/api/v1/rollouts/", body, format="json").status_code == 403
    response = operator_api.post("/api/v1/rollouts/", body, format="json")
    assert response.status_code == 201, response.json()
    created = response.json()
    assert response["Location"] == created["url"] and created["url"].endswith(f"/api/v1/rollouts/{created['id']}/")
    assert created["progress"]["total"] == 4 and created["busy_policy"] == "drain"

    with django_assert_max_num_queries(6):
        listed = viewer_api.get("/api/v1/rollouts/?active=true").json()
    assert [r["id"] for r in listed["results"]] == [created["id"]]
    detail = viewer_api.get(f"/api/v1/rollouts/{created['id']}/").json()
    assert len(detail["changes"]) == 4 and detail["changes"][0]["mig_config"].startswith("tessera-mig-")

    assert operator_api.post(f"/api/v1/rollouts/{created['id']}/pause/").json()["status"] == "paused"
    again = operator_api.post(f"/api/v1/rollouts/{created['id']}/pause/")
    assert again.status_code == 409 and "cannot be pause" in again.json()["message"]
    assert operator_api.post(f"/api/v1/rollouts/{created['id']}/cancel/").json()["status"] == "cancelled"

    changes = viewer_api.get(f"/api/v1/node-changes/?rollout={created['id']}&status=cancelled").json()
    assert changes["count"] == 4


def test_nothing_to_roll_out_and_bad_input(pool, operator_api):
    operator_api.post("/api/v1/rollouts/", {"pool": pool.pk}, format="json")
    nothing = operator_api.post("/api/v1/rollouts/", {"pool": pool.pk}, format="json")
    assert nothing.status_code == 400 and "Nothing to roll out" in nothing.json()["message"]
    bad = operator_api.post(
        "/api/v1/rollouts/", {"pool": pool.pk, "batch_size": 0, "busy_policy": "yolo"}, format="json"
    )
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"batch_size", "busy_policy"}
    assert Rollout.objects.count() == 1


def test_audit_log_filters(pool, viewer_api, operator_api, api_client):
    operator_api.post("/api/v1/rollouts/", {"pool": pool.pk}, format="json")
    assert api_client.get("/api/v1/audit-events/").status_code == 401
    events = viewer_api.get("/api/v1/audit-events/?action=rollout.").json()["results"]
    assert [e["action"] for e in events] == ["rollout.create"]
    assert events[0]["actor_label"] == "operator"
    profile_events = viewer_api.get("/api/v1/audit-events/?object_type=sharingprofile").json()
    assert profile_events["count"] == 1


def test_a_failed_canary_shows_its_back_off_and_operators_retry_it_now(pool, operator_api, viewer_api):
    body = {"pool": pool.pk, "canary_count": 1, "max_failures": 3, "on_failure": "pause"}
    created = operator_api.post("/api/v1/rollouts/", body, format="json").json()
    assert created["on_failure"] == "pause" and created["superseded_by"] is None
    canary = _fail_canary(pool.cluster, created["id"])
    services.rollout_advance(created["id"])
    rollout = viewer_api.get(f"/api/v1/rollouts/{created['id']}/").json()
    assert (rollout["status"], rollout["progress"]["counts"]) == ("paused", {"rolled_back": 1, "queued": 3})

    (retry,) = viewer_api.get("/api/v1/node-retries/").json()["results"]
    assert (retry["node_name"], retry["failures"], retry["waiting"]) == (canary.node.name, 1, True)
    assert retry["config_id"] == canary.to_config["config_id"] and retry["rollout"] == created["id"]
    url = f"/api/v1/node-retries/{canary.node_id}/retry-now/"
    assert viewer_api.post(url).status_code == 403
    assert operator_api.post(url).json() == {"retried": 1}
    assert viewer_api.get(f"/api/v1/node-retries/{canary.node_id}/").json()["waiting"] is False
    assert AuditEvent.objects.filter(action="node.retry_now", actor_label="operator").count() == 1
    (again,) = reconcile.reconcile()  # the retry starts at once, beside the paused rollout's queued nodes
    assert NodeChange.objects.get(rollout_id=again).node_id == canary.node_id
    assert operator_api.post(f"/api/v1/rollouts/{created['id']}/retry-now/").json() == {"retried": 0}
    assert operator_api.post("/api/v1/node-retries/999999/retry-now/").status_code == 404


def test_rollout_state_values_and_a_bad_on_failure(pool, operator_api, viewer_api):
    bad = operator_api.post("/api/v1/rollouts/", {"pool": pool.pk, "on_failure": "panic"}, format="json")
    assert bad.status_code == 400 and set(bad.json()["errors"]) == {"on_failure"}
    Rollout.objects.create(title="old", trigger="user", actor_label="x", status="superseded")
    listed = viewer_api.get("/api/v1/rollouts/?status=superseded").json()
    assert [r["title"] for r in listed["results"]] == ["old"]
    schema = viewer_api.get("/api/schema/?format=json").json()
    assert "superseded" in str(schema["components"]["schemas"])


def test_assigning_another_profile_and_rolling_out_now_supersedes_the_running_rollout(pool, operator, admin_user):
    old_id = rollouts.rollout_start(actor=Actor.for_user(operator), nodes=pool.nodes.all(), canary_count=1).pk
    whole = sharing_services.profile_create(
        actor=Actor.for_user(admin_user), name="whole", mode="passthrough", target_products=[H100]
    )
    _, new = rollouts.pool_assign_and_roll_out(
        actor=Actor.for_user(operator), pool=pool, profile=whole, strategy={"batch_size": 4}
    )
    new_id = new.pk
    old = Rollout.objects.get(pk=old_id)
    assert (old.status, old.superseded_by_id) == ("superseded", new_id)
    assert Rollout.objects.get(pk=new_id).changes.count() == 4
    event = AuditEvent.objects.get(action="rollout.superseded")
    assert event.message == f"superseded: pool {pool.name}'s default profile is now whole by operator"
