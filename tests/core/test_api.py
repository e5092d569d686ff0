"""The API's shared machinery: authentication, token rotation, the one error shape, and the OpenAPI schema."""

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from rest_framework.test import APIClient

from core import services
from core.api.exceptions import exception_handler
from core.exceptions import ApplicationError

pytestmark = pytest.mark.django_db


def token_client(key):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_anonymous_gets_401_in_the_error_shape(api_client):
    response = api_client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.data == {"message": "Authentication credentials were not provided.", "errors": {}}
    assert response["WWW-Authenticate"] == "Token"


def test_token_authentication_and_role(operator):
    response = token_client(services.api_token_rotate(user=operator)[1]).get("/api/v1/me/")
    assert response.status_code == 200
    assert response.data == {"username": "operator", "role": "operator"}


def test_session_authentication(viewer):
    client = APIClient()
    client.force_login(viewer)
    assert client.get("/api/v1/me/").data["role"] == "viewer"


def test_rotating_the_token_invalidates_the_old_one(viewer):
    _, old = services.api_token_rotate(user=viewer)
    response = token_client(old).post("/api/v1/me/token/rotate/")
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    new = response.data["token"]
    assert new != old and new.startswith("tst_")
    assert token_client(old).get("/api/v1/me/").status_code == 401
    assert token_client(new).get("/api/v1/me/").status_code == 200


def test_user_without_a_role_is_refused(db):
    from tests.factories import UserFactory

    client = APIClient()
    client.force_authenticate(UserFactory(username="nobody"))
    response = client.get("/api/v1/me/")
    assert response.status_code == 403
    assert response.data == {"message": "Your role does not allow this.", "errors": {}}


@pytest.mark.parametrize(
    ("exc", "status", "body"),
    [
        (
            ApplicationError("Cluster busy.", errors={"name": ["taken"]}, status=409),
            409,
            {"message": "Cluster busy.", "errors": {"name": ["taken"]}},
        ),
        (
            ValidationError({"name": ["Too long."]}),
            400,
            {"message": "Invalid input: name: Too long.", "errors": {"name": ["Too long."]}},
        ),
        (
            ValidationError({"__all__": ["Needs credentials."], "name": ["Too long."]}),
            400,
            {
                "message": "Needs credentials.",
                "errors": {"non_field_errors": ["Needs credentials."], "name": ["Too long."]},
            },
        ),
        (
            ValidationError("Plain message."),
            400,
            {"message": "Plain message.", "errors": {"non_field_errors": ["Plain message."]}},
        ),
    ],
)
def test_exception_handler_gives_one_shape(exc, status, body):
    response = exception_handler(exc, {})
    assert (response.status_code, response.data) == (status, body)


def test_openapi_schema_generates_without_warnings(tmp_path):
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    schema = (tmp_path / "schema.yaml").read_text()
    assert "/api/v1/gpus/" in schema


def test_schema_and_docs_are_served(viewer_api, client, viewer):
    assert viewer_api.get("/api/schema/").status_code == 200
    client.force_login(viewer)
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"cdn" not in docs.content.lower()
