"""Every door has its lock: the schema, the API docs and /metrics are closed to anonymous callers unless settings
open them, and a user without a role is told to ask for one (issue 15, point 4). Who may call each route is the
matrix of tests/core/test_authz_matrix.py."""

import pytest

from core.services import api_token_rotate
from core.views import NO_ROLE
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_a_user_without_role_is_told_to_ask_an_admin(client):
    client.force_login(UserFactory(username="newcomer"))
    html = client.get("/").content.decode()
    assert "Your account has no role yet" in html and "Ask an admin" in html
    assert NO_ROLE.startswith("Your account has no role yet")


def test_a_viewer_reads_the_pages(client, viewer):
    client.force_login(viewer)
    for path in ("/", "/nodes/", "/gpus/", "/profiles/", "/schedules/", "/rollouts/", "/audit/", "/qos/"):
        assert client.get(path).status_code == 200, path


# --- /metrics ------------------------------------------------------------------------------------------------------


def test_metrics_refuse_anonymous_callers_and_users_without_role(client):
    response = client.get("/metrics")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    client.force_login(UserFactory(username="no-role"))
    assert client.get("/metrics").status_code == 403


def test_metrics_for_a_viewer(client, viewer):
    client.force_login(viewer)
    assert b"tessera_gpus" in client.get("/metrics").content


def test_metrics_with_the_configured_bearer_token(client, settings):
    settings.TESSERA = {**settings.TESSERA, "METRICS_TOKEN": "scrape-me-0123456789"}
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-0123456789").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_no_token_configured_means_no_token_accepted(client, settings):
    settings.TESSERA = {**settings.TESSERA, "METRICS_TOKEN": ""}
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def test_metrics_with_a_viewers_api_token(client, viewer):
    """A token acts with its user's role (docs/security.md), on /metrics too: Prometheus can scrape with a viewer's
    token (`authorization: {type: Token}`) where no metrics token is set (issue 25)."""
    _, token = api_token_rotate(user=viewer)
    assert b"tessera_gpus" in client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token}").content
    _, no_role_token = api_token_rotate(user=UserFactory(username="newcomer"))
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {no_role_token}").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token tsu_wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token \u00e9").status_code == 401
    viewer.is_active = False
    viewer.save()
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token}").status_code == 401


def test_metrics_public_when_configured(client, settings):
    settings.TESSERA = {**settings.TESSERA, "METRICS_PUBLIC": True}
    assert client.get("/metrics").status_code == 200


# --- schema and docs -----------------------------------------------------------------------------------------------


def test_schema_and_docs_need_a_role_by_default(client, api_client):
    assert api_client.get("/api/schema/").status_code == 401
    response = client.get("/api/docs/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    client.force_login(UserFactory(username="no-role"))
    for path in ("/api/schema/", "/api/docs/"):
        assert client.get(path).status_code == 403, path


def test_schema_and_docs_for_a_viewer(client, viewer):
    client.force_login(viewer)
    for path in ("/api/schema/", "/api/docs/", "/api/docs/?script="):
        assert client.get(path).status_code == 200, path


def test_schema_and_docs_public_when_configured(client, settings):
    settings.TESSERA = {**settings.TESSERA, "API_DOCS_PUBLIC": True}
    for path in ("/api/schema/", "/api/docs/"):
        assert client.get(path).status_code == 200, path
