"""Bad input answers 400 in the one error shape on every endpoint, never a 500: JSON nested 100,000 deep, bodies
over the size limit, integers beyond their column's range (issue 15, point 9)."""

import json
import re

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from agents.authentication import AgentRegisterThrottle
from core.audit import Actor
from fleet import agent_credentials
from tests.factories import ClusterFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db
DEEP = "[" * 100_000 + "]" * 100_000


def _api_paths(patterns=None, prefix=""):
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _api_paths(entry.url_patterns, route)
        elif isinstance(entry, URLPattern) and route.startswith("api/v1/") and "(?P<format>" not in route:
            route = re.sub(r"\^|\$|\\\.", "", route)
            route = re.sub(r"\(\?P<\w+>[^)]*\)", "1", route)
            yield "/" + re.sub(r"<(?:\w+:)?\w+>", "1", route)


API_PATHS = sorted(set(_api_paths()))


def assert_error_shape(response, status=400, field=None):
    """The one error shape, with a message for `field` when given."""
    assert response.status_code == status, (response.status_code, response.content[:300])
    body = response.json()
    assert set(body) == {"message", "errors"} and isinstance(body["errors"], dict), body
    assert field is None or body["errors"][field], body


def test_there_are_api_endpoints_to_try():
    assert {"/api/v1/clusters/", "/api/v1/agent/register/", "/api/v1/profiles/1/preview/"} <= set(API_PATHS)


@pytest.mark.parametrize("path", API_PATHS)
def test_json_nested_100000_deep_is_a_400_everywhere(admin_api, path):
    for method in (admin_api.post, admin_api.put, admin_api.patch):
        response = method(path, DEEP, content_type="application/json")
        assert response.status_code < 500, (path, response.status_code)
        if response.status_code == 400:
            assert_error_shape(response)


def test_json_nested_too_deep_where_the_body_is_read(admin_api):
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    for method, path in [("post", "/api/v1/clusters/"), ("patch", f"/api/v1/clusters/{cluster.pk}/")]:
        response = getattr(admin_api, method)(path, DEEP, content_type="application/json")
        assert_error_shape(response)
        assert "nested" in response.json()["message"]
    shallow_enough = "[" * 99 + "]" * 99  # parsed, then refused by the serializer as usual
    assert_error_shape(admin_api.post("/api/v1/clusters/", shallow_enough, content_type="application/json"))
    nested = '{"name": "x", "driver": "agent", "extra": ' + "[" * 101 + "]" * 101 + "}"
    assert "nested" in admin_api.post("/api/v1/clusters/", nested, content_type="application/json").json()["message"]


@pytest.fixture
def agent_client(admin_user):
    AgentRegisterThrottle.counts._reset()
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    _, join = agent_credentials.agent_join_token_create(actor=Actor.for_user(admin_user), cluster=cluster, name="t")
    body = {"join_token": join, "hostname": "gpu-1", "agent_version": "0.1.0"}
    credential = APIClient().post("/api/v1/agent/register/", body, format="json").json()["credential"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return client


def test_the_agent_endpoints_too(agent_client):
    for path in ("/api/v1/agent/register/", "/api/v1/agent/report/", "/api/v1/agent/outcome/"):
        assert_error_shape(agent_client.post(path, DEEP, content_type="application/json"))
        huge = json.dumps({"hostname": "x" * 3_000_000})
        response = agent_client.post(path, huge, content_type="application/json")
        assert_error_shape(response)
        assert "larger than" in response.json()["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded"])
def test_a_body_over_the_size_limit_is_a_400_in_the_error_shape(admin_api, content_type):
    body = json.dumps({"name": "x" * 3_000_000}) if content_type.endswith("json") else "name=" + "x" * 3_000_000
    response = admin_api.post("/api/v1/clusters/", body, content_type=content_type)
    assert_error_shape(response)
    assert response.json()["message"].startswith("The request body is larger than")


def test_max_uses_beyond_the_column_is_a_field_error(admin_api):
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    body = {"cluster": cluster.pk, "name": "t", "max_uses": 2**63}
    response = admin_api.post("/api/v1/agent-join-tokens/", body, format="json")
    assert_error_shape(response)
    assert "max_uses" in response.json()["errors"]


def test_ids_beyond_the_column_are_400s_not_500s(admin_api):
    pool = NodePoolFactory()
    NodeFactory(cluster=pool.cluster)
    response = admin_api.post(f"/api/v1/node-pools/{pool.pk}/members/", {"nodes": [2**70]}, format="json")
    assert_error_shape(response)
    assert admin_api.get(f"/api/v1/nodes/{2**70}/").status_code == 404
    # A key that is a foreign key (a node's retry): the database, not Django, finds it out of range.
    assert admin_api.get(f"/api/v1/node-retries/{2**70}/").status_code == 404
    assert admin_api.post(f"/api/v1/node-retries/{2**70}/retry-now/").status_code == 404


def test_an_overflow_no_serializer_caught_is_a_400(admin_api, monkeypatch):
    from fleet import services

    def overflow(**kwargs):
        raise OverflowError("Python int too large to convert to SQLite INTEGER")

    monkeypatch.setattr(services, "cluster_create", overflow)
    response = admin_api.post("/api/v1/clusters/", {"name": "x", "driver": "agent"}, format="json")
    assert_error_shape(response)
    assert response.json()["message"] == "A value is out of range for its field."


# What Schemathesis found (tests/core/test_api_schema_fuzz.py), pinned here where it fails fast and says why.


@pytest.mark.parametrize("page_size", ["abc", "0", "-3", "1.5", "٣"])
def test_a_page_size_that_is_no_positive_integer_is_a_400(admin_api, page_size):
    assert_error_shape(admin_api.get("/api/v1/clusters/", {"page_size": page_size}), field="page_size")


def test_a_page_size_beyond_the_cap_gets_the_cap(admin_api):
    assert admin_api.get("/api/v1/clusters/", {"page_size": "9" * 5000}).status_code == 200


@pytest.mark.parametrize("value", ["maybe", "1.5", "null"])
def test_a_boolean_filter_refuses_what_is_neither_true_nor_false(admin_api, value):
    assert_error_shape(admin_api.get("/api/v1/nodes/", {"ready": value}), field="ready")
    assert_error_shape(admin_api.get("/api/v1/schedules/", {"enabled": value}), field="enabled")
    assert admin_api.get("/api/v1/nodes/", {"ready": "false"}).status_code == 200


def test_an_unknown_choice_in_a_filter_is_a_400(admin_api):
    assert_error_shape(admin_api.get("/api/v1/audit-events/", {"actor_kind": "nobody"}), field="actor_kind")


def test_no_route_under_the_api_is_a_json_404(admin_api):
    response = admin_api.get("/api/v1/clusters/not-a-number/")
    assert response.status_code == 404 and response.json() == {"message": "Not found.", "errors": {}}


def test_a_transitions_range_ending_before_now_is_a_400(admin_api, admin_user):
    from scheduling import services as scheduling_services
    from sharing import services as sharing_services

    actor = Actor.for_user(admin_user)
    pool = NodePoolFactory(cluster=ClusterFactory(driver="agent", kubeconfig_path=""))
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=["x"])
    schedule = scheduling_services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=whole, night_profile=whole, time_zone="UTC"
    )
    url = f"/api/v1/schedules/{schedule.pk}/transitions/"
    assert_error_shape(admin_api.get(url, {"end": "2001-01-01T00:00:00Z"}), field="end")
    assert set(admin_api.get(url).json()) == {"count", "next", "previous", "results"}


def test_a_schedule_update_documents_both_of_its_answers(admin_api):
    """PUT/PATCH answer the schedule saved, or with `dry_run` what saving would do: the schema says either."""
    schema = admin_api.get("/api/schema/", {"format": "json"}).json()
    for method in ("put", "patch"):
        answer = schema["paths"]["/api/v1/schedules/{id}/"][method]["responses"]["200"]
        assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ScheduleOrDryRun"}
    refs = {s["$ref"] for s in schema["components"]["schemas"]["ScheduleOrDryRun"]["oneOf"]}
    assert refs == {"#/components/schemas/Schedule", "#/components/schemas/DryRun"}


def test_a_patch_still_needs_whole_rows_of_the_lists_it_replaces(admin_api, admin_user):
    from scheduling import services as scheduling_services
    from sharing import services as sharing_services

    actor = Actor.for_user(admin_user)
    pool = NodePoolFactory(cluster=ClusterFactory(driver="agent", kubeconfig_path=""))
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=["x"])
    schedule = scheduling_services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=whole, night_profile=whole, time_zone="UTC"
    )
    url = f"/api/v1/schedules/{schedule.pk}/"
    for dry_run in ("false", "true"):
        response = admin_api.patch(f"{url}?dry_run={dry_run}", {"exceptions": [{"note": "x"}]}, format="json")
        assert_error_shape(response, field="exceptions[0].date")
        response = admin_api.patch(f"{url}?dry_run={dry_run}", {"windows": [{"name": "w"}]}, format="json")
        assert_error_shape(response, field="windows[0].profile")
