"""Every door has its lock: every UI page needs the viewer role (as every API read does), and the schema, the API
docs and /metrics are closed to anonymous callers unless settings open them (issue 15, point 4)."""

import re
import uuid

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from core.views import NO_ROLE
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

# Pages open without a role, each for a reason; everything else of the UI must refuse a user without one.
OPEN = {
    "login": "signing in",
    "logout": "signing out",
    "oidc_authentication_init": "signing in with single sign-on (404 unless configured; tests/core/test_sso.py)",
    "oidc_authentication_callback": "the provider's answer to a sign-in (tests/core/test_sso.py)",
    "healthz": "liveness probe",
    "readyz": "readiness probe",
    "metrics": "its own check (bearer token or viewer), tested below",
    "api-schema": "its own check (ApiDocsPermission), tested below",
    "api-docs": "its own check (ApiDocsPermission), tested below",
    "api-redoc": "its own check (ApiDocsPermission), tested below",
}
SAMPLE = {"int": "1", "str": "x", "slug": "x", "path": "x", "uuid": str(uuid.uuid4())}


def _ui_paths(patterns=None, prefix="", namespace=""):
    """(name, example path) of every UI route: the API (its own permission classes) and Django's admin excluded."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = str(entry.pattern)
        if isinstance(entry, URLResolver):
            if route.startswith(("api/v1/", "admin/")):
                continue
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _ui_paths(entry.url_patterns, prefix + route, inner)
        elif isinstance(entry, URLPattern) and entry.name:
            path = re.sub(r"<(?:(\w+):)?\w+>", lambda m: SAMPLE[m.group(1) or "str"], prefix + route)
            yield f"{namespace}{entry.name}", "/" + path


UI_PATHS = sorted(p for p in _ui_paths() if p[0] not in OPEN)


def test_the_ui_has_pages_to_check():
    names = {name for name, _ in UI_PATHS}
    assert {"console:overview", "fleet:node_list", "audit_log", "token_detail", "sharing:profile_list"} <= names


@pytest.mark.parametrize(("name", "path"), UI_PATHS, ids=[name for name, _ in UI_PATHS])
def test_every_ui_page_needs_a_role(client, name, path):
    anonymous = client.get(path)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/"), name
    client.force_login(UserFactory(username="no-role"))
    for method in (client.get, client.post):
        refused = method(path)
        assert refused.status_code == 403, f"{name}: {refused.status_code}"
        assert "Your account has no role yet" in refused.content.decode(), name


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


def test_metrics_public_when_configured(client, settings):
    settings.TESSERA = {**settings.TESSERA, "METRICS_PUBLIC": True}
    assert client.get("/metrics").status_code == 200


# --- schema and docs -----------------------------------------------------------------------------------------------


def test_schema_and_docs_need_a_role_by_default(client, api_client):
    assert api_client.get("/api/schema/").status_code == 401
    for path in ("/api/docs/", "/api/redoc/"):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), path
    client.force_login(UserFactory(username="no-role"))
    for path in ("/api/schema/", "/api/docs/", "/api/redoc/"):
        assert client.get(path).status_code == 403, path


def test_schema_and_docs_for_a_viewer(client, viewer):
    client.force_login(viewer)
    for path in ("/api/schema/", "/api/docs/", "/api/docs/?script=", "/api/redoc/"):
        assert client.get(path).status_code == 200, path


def test_schema_and_docs_public_when_configured(client, settings):
    settings.TESSERA = {**settings.TESSERA, "API_DOCS_PUBLIC": True}
    for path in ("/api/schema/", "/api/docs/", "/api/redoc/"):
        assert client.get(path).status_code == 200, path
