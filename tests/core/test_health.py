import json
import os
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core import health, metrics
from core.services import api_token_rotate
from tests.factories import ClusterFactory, GpuFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_healthz_is_cheap(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_reports_each_dependency(client, viewer):
    client.force_login(viewer)
    response = client.get("/readyz")
    assert response.status_code == 200  # only the database is required by default
    body = response.json()
    checks = body["checks"]
    assert checks["database"]["ok"] and checks["database"]["required"]
    assert "answered in" in checks["database"]["detail"]
    assert checks["broker"]["ok"], checks["broker"]
    assert not checks["beat"]["ok"] and "no reconcile tick has run yet" in checks["beat"]["detail"]
    assert body["status"] == "degraded"


def test_readyz_answers_503_when_a_required_check_fails(client, settings, viewer):
    settings.TESSERA = {**settings.TESSERA, "READYZ_REQUIRED": ["database", "beat"]}
    assert client.get("/readyz").json() == {"status": "unavailable"}  # a load balancer's probe: the status alone
    client.force_login(viewer)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
    assert response.json()["checks"]["beat"]["required"]


def test_readyz_a_failing_check_says_why(client, monkeypatch, viewer):
    client.force_login(viewer)

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setitem(health._PROVIDERS, "database", broken)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["database"] == {
        "ok": False,
        "required": True,
        "detail": "the check itself failed: RuntimeError: boom",
    }


def test_readyz_tells_anonymous_callers_the_status_alone(client, settings, viewer):
    """Issue 25: anonymous /readyz named every cluster (`watch:<cluster>`), the database engine and the broker. The
    status and its code (what the Kubernetes probes and `make run`'s supervisor read) stay for everyone; the
    details are for those who may read /metrics."""
    settings.TESSERA = {**settings.TESSERA, "METRICS_TOKEN": "probe-me-0123456789"}
    ClusterFactory(name="secret-prod-east", driver="kubernetes")
    anonymous = client.get("/readyz")
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "degraded"}
    for leak in ("secret-prod-east", "watch:", connection.vendor, "broker", "redis", "memory"):
        assert leak not in anonymous.content.decode()
    assert "Authorization" in anonymous["Vary"]
    no_role = UserFactory(username="newcomer")
    _, no_role_token = api_token_rotate(user=no_role)
    _, viewer_token = api_token_rotate(user=viewer)
    for headers in ({"HTTP_AUTHORIZATION": "Bearer wrong"}, {"HTTP_AUTHORIZATION": f"Token {no_role_token}"}):
        assert client.get("/readyz", **headers).json() == {"status": "degraded"}
    client.force_login(no_role)
    assert client.get("/readyz").json() == {"status": "degraded"}
    client.logout()
    for authorization in ("Bearer probe-me-0123456789", f"Token {viewer_token}"):
        checks = client.get("/readyz", HTTP_AUTHORIZATION=authorization).json()["checks"]
        assert {"database", "broker", "watch:secret-prod-east"} <= set(checks)
    client.force_login(viewer)
    assert "watch:secret-prod-east" in client.get("/readyz").json()["checks"]


def test_metrics_exposes_fleet_gauges(scrape):
    GpuFactory(product="NVIDIA-A30", health="unhealthy", ecc_dbe_total=2)
    families = scrape()
    assert families["tessera_gpus"][(("health", "unhealthy"), ("product", "NVIDIA-A30"))] == 1
    assert families["tessera_gpu_ecc_errors"][(("product", "NVIDIA-A30"), ("type", "dbe"))] == 2
    (labels,) = families["tessera_gpu_unhealthy"]
    assert dict(labels)["reason"] == "ecc"
    assert "tessera_nodes_stale" in families
    assert families["tessera_broker_up"][()] == 1
    assert all(v == 1 for v in families["tessera_scrape_collector_success"].values())
    assert {dict(k)["collector"] for k in families["tessera_scrape_collector_success"]} == {
        "core",
        "embedded",
        "fleet",
        "sharing",
        "scheduling",
        "worker",
    }


def test_a_failing_collector_leaves_the_others(scrape, monkeypatch):
    class Broken:
        def collect(self):
            raise RuntimeError("boom")
            yield

    monkeypatch.setitem(metrics._APP_COLLECTORS.collectors, "sharing", Broken())
    families = scrape()
    assert families["tessera_scrape_collector_success"][(("collector", "sharing"),)] == 0
    assert families["tessera_scrape_collector_success"][(("collector", "fleet"),)] == 1


def test_age_and_timestamp_helpers():
    now = timezone.now()
    assert metrics.age_seconds(now - timedelta(seconds=5), now) == 5
    assert metrics.age_seconds(now + timedelta(seconds=5), now) == 0
    assert metrics.timestamp(None) is None


def test_the_parts_of_make_run_show_in_readyz_metrics_and_the_overview(client, viewer, settings, tmp_path, scrape):
    """The supervisor's status file (console/supervisor.py) is what an admin sees: a part not running fails its
    readiness check (reported, not required), restarts are counted, and the overview lists what was restarted."""
    settings.VAR_DIR = tmp_path
    (tmp_path / "run").mkdir()
    children = {
        "web": {"state": "running", "restarts": 0, "last_exit": None, "last_exit_at": None},
        "worker": {"state": "running", "restarts": 2, "last_exit": -9, "last_exit_at": time.time() - 30},
        "agents": {"state": "given_up", "restarts": 4, "last_exit": 1, "last_exit_at": time.time() - 5},
    }
    status = {"supervisor_pid": os.getpid(), "updated_at": time.time(), "children": children}
    (tmp_path / "run" / "children.json").write_text(json.dumps(status))

    client.force_login(viewer)
    body = client.get("/readyz").json()
    assert body["checks"]["embedded:web"]["ok"] and not body["checks"]["embedded:web"]["required"]
    assert "restarted 2 times, last exit signal 9" in body["checks"]["embedded:worker"]["detail"]
    assert not body["checks"]["embedded:agents"]["ok"]
    assert "not restarted any more" in body["checks"]["embedded:agents"]["detail"]

    metrics = scrape()
    assert metrics["tessera_embedded_child_restarts_total"][(("child", "worker"),)] == 2
    assert metrics["tessera_embedded_child_up"][(("child", "agents"),)] == 0

    GpuFactory()  # an empty fleet's overview shows how to start instead
    client.force_login(viewer)
    html = client.get("/").content.decode()
    assert "Restarted parts" in html and "worker: running, 2 restarts" in html and "agents: given_up" in html

    status["supervisor_pid"] = 2**22 + 12345  # the supervisor is gone: nothing is claimed any more
    (tmp_path / "run" / "children.json").write_text(json.dumps(status))
    assert "embedded:web" not in client.get("/readyz").json()["checks"]
