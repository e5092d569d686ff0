"""Single sign-on with OpenID Connect against a real provider on loopback (oidc-provider-mock): claims map to a role
on every sign-in, password sign-in can be switched off (Django admin's too) while API tokens keep working, and
signing out ends the provider's session (issue 19, point 4)."""

import json
import os
import socket
import subprocess
import sys
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client

from core import sso
from core.checks import sso_settings
from core.models import AuditEvent, SsoIdentity
from core.roles import Role, parse_role_map, role_for_claim_values, user_role
from core.services import api_token_rotate
from tests.conftest import SSO_ROLE_MAP
from tests.factories import UserFactory
from tests.processes import ROOT

PASSWORD = "pw-for-tests-1"  # tests.factories.UserFactory's


# --- claims → role, pure -------------------------------------------------------------------------------------------


def test_a_role_map_reads_value_equals_role():
    assert parse_role_map(SSO_ROLE_MAP) == {
        "tessera-admins": Role.ADMIN,
        "tessera-ops": Role.OPERATOR,
        "everyone": Role.VIEWER,
    }
    assert parse_role_map(" gpu-team = Operator , ") == {"gpu-team": Role.OPERATOR}
    assert parse_role_map("") == {}


@pytest.mark.parametrize("text", ["admins", "=admin", "admins=root", "admins=none"])
def test_a_role_map_entry_without_a_value_or_a_known_role_is_refused(text):
    with pytest.raises(ValueError, match="viewer|operator|admin"):
        parse_role_map(text)


@pytest.mark.parametrize(
    "values, role",
    [
        (["everyone", "tessera-ops", "tessera-admins"], Role.ADMIN),  # the highest wins
        (["tessera-ops", "everyone"], Role.OPERATOR),
        (["everyone", "unrelated"], Role.VIEWER),
        (["Tessera-Admins", "unrelated"], Role.NONE),  # values match exactly
        ([], Role.NONE),
        ([{"tessera-admins": 1}, 3], Role.NONE),  # not strings: ignored
    ],
)
def test_the_highest_mapped_role_of_the_claim_values_wins(values, role):
    assert role_for_claim_values(values, parse_role_map(SSO_ROLE_MAP)) == role


def test_claim_values_reach_into_objects_and_take_one_string_as_a_list():
    claims = {"groups": "everyone", "realm_access": {"roles": ["tessera-ops"]}, "sub": "x"}
    assert sso.claim_values(claims, "groups") == ["everyone"]
    assert sso.claim_values(claims, "realm_access.roles") == ["tessera-ops"]
    assert sso.claim_values(claims, "realm_access.missing") == []
    assert sso.claim_values(claims, "sub.deeper") == []


# --- through the provider ------------------------------------------------------------------------------------------


def sso_sign_in(client, provider, sub: str, *, next_url: str = ""):
    """A browser's trip: Tessera → the provider's authorization form, submitted for `sub` → Tessera's callback.
    Returns Tessera's answer to the callback."""
    start = client.get("/oidc/authenticate/", {"next": next_url} if next_url else {})
    assert start.status_code == 302 and start["Location"].startswith(f"{provider.url}/oauth2/authorize?")
    query = parse_qs(urlsplit(start["Location"]).query)
    assert query["client_id"] == ["tessera"] and query["code_challenge_method"] == ["S256"] and query["nonce"]
    assert requests.get(start["Location"], timeout=5).status_code == 200  # the provider's sign-in form
    answer = requests.post(start["Location"], data={"sub": sub}, allow_redirects=False, timeout=5)
    assert answer.status_code == 302, answer.text
    callback = urlsplit(answer.headers["Location"])
    assert callback.path == "/oidc/callback/"
    return client.get(f"{callback.path}?{callback.query}")


def signed_in_as(client) -> str:
    response = client.get("/api/v1/me/")
    return response.json()["username"] if response.status_code == 200 else ""


def role_of(username: str) -> Role:
    return user_role(get_user_model().objects.get(username=username))


@pytest.mark.django_db
def test_signing_in_through_the_provider_makes_the_account_with_its_mapped_role(client, sso):
    sso.set_user("u-1001", preferred_username="alice", email="alice@example.com", groups=["everyone", "tessera-ops"])
    answer = sso_sign_in(client, sso, "u-1001", next_url="/nodes/")
    assert answer.status_code == 302 and answer["Location"] == "/nodes/"
    assert client.get("/nodes/").status_code == 200 and signed_in_as(client) == "alice"
    alice = get_user_model().objects.get(username="alice")
    assert user_role(alice) == Role.OPERATOR and alice.email == "alice@example.com"
    assert not alice.has_usable_password()  # signs in through the provider only
    assert SsoIdentity.objects.get(user=alice).subject == "u-1001"
    event = AuditEvent.objects.get(action="user.set_role", object_id=str(alice.pk))
    assert (event.before, event.after, event.actor_label) == ({"role": "none"}, {"role": "operator"}, "single sign-on")


@pytest.mark.django_db
def test_a_role_changed_at_the_provider_follows_on_the_next_sign_in(sso):
    sso.set_user("u-7", preferred_username="bob", groups=["tessera-admins", "everyone"])
    assert sso_sign_in(Client(), sso, "u-7").status_code == 302
    assert role_of("bob") == Role.ADMIN

    sso.set_user("u-7", preferred_username="bob", groups=["everyone"])
    assert sso_sign_in(Client(), sso, "u-7").status_code == 302
    assert role_of("bob") == Role.VIEWER

    sso.set_user("u-7", preferred_username="bob", groups=[])  # removed from every mapped group
    client = Client()
    assert sso_sign_in(client, sso, "u-7").status_code == 302
    assert role_of("bob") == Role.NONE
    page = client.get("/")
    assert page.status_code == 403 and "Your role comes from single sign-on" in page.content.decode()
    changes = AuditEvent.objects.filter(action="user.set_role").order_by("pk")
    assert [e.after["role"] for e in changes] == ["admin", "viewer", "none"]

    assert sso_sign_in(Client(), sso, "u-7").status_code == 302  # unchanged: nothing more audited
    assert AuditEvent.objects.filter(action="user.set_role").count() == 3
    assert get_user_model().objects.filter(username="bob").count() == 1


@pytest.mark.django_db
def test_a_provider_account_never_takes_over_a_local_one(client, sso, admin_user):
    sso.set_user("mallory", preferred_username="admin", groups=["tessera-admins"])
    answer = sso_sign_in(client, sso, "mallory")
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    page = client.get("/login/").content.decode()
    assert "Single sign-on failed: the username &#x27;admin&#x27; belongs to a local account" in page
    assert signed_in_as(client) == "" and not SsoIdentity.objects.exists()


@pytest.mark.django_db
def test_an_account_deactivated_in_tessera_stays_out(client, sso):
    sso.set_user("u-8", preferred_username="ivan", groups=["tessera-admins"])
    sso_sign_in(Client(), sso, "u-8")
    get_user_model().objects.filter(username="ivan").update(is_active=False)
    assert sso_sign_in(client, sso, "u-8")["Location"] == "/login/"
    assert "the account ivan is deactivated in Tessera" in client.get("/login/").content.decode()
    assert signed_in_as(client) == ""


@pytest.mark.django_db
def test_a_refusal_at_the_provider_and_a_replayed_callback_sign_nobody_in(client, sso):
    start = client.get("/oidc/authenticate/")
    denied = requests.post(start["Location"], data={"action": "deny"}, allow_redirects=False, timeout=5)
    callback = urlsplit(denied.headers["Location"])
    assert client.get(f"{callback.path}?{callback.query}")["Location"] == "/login/"
    assert "Example ID answered access_denied" in client.get("/login/").content.decode()

    sso.set_user("u-9", preferred_username="carol", groups=["everyone"])
    start = client.get("/oidc/authenticate/")
    answer = requests.post(start["Location"], data={"sub": "u-9"}, allow_redirects=False, timeout=5)
    callback = urlsplit(answer.headers["Location"])
    assert client.get(f"{callback.path}?{callback.query}").status_code == 302 and signed_in_as(client) == "carol"
    assert Client().get(f"{callback.path}?{callback.query}")["Location"] == "/login/"  # no session of its own
    assert client.get(f"{callback.path}?{callback.query}").status_code == 400  # its state was used up


@pytest.mark.django_db
def test_an_address_locked_out_by_failed_passwords_is_locked_out_of_single_sign_on_too(client, sso):
    for i in range(5):
        client.post("/login/", {"username": f"guess-{i}", "password": "wrong"})
    sso.set_user("u-5", preferred_username="hana", groups=["everyone"])
    locked = sso_sign_in(client, sso, "u-5")
    assert locked.status_code == 429 and "Sign-in locked" in locked.content.decode()
    assert signed_in_as(client) == ""


@pytest.mark.django_db
def test_signing_out_ends_the_provider_session(client, sso):
    sso.set_user("u-2", preferred_username="dora", groups=["everyone"])
    sso_sign_in(client, sso, "u-2")
    out = client.post("/logout/")
    assert out.status_code == 302 and out["Location"].startswith(f"{sso.url}/oauth2/end_session?")
    query = parse_qs(urlsplit(out["Location"]).query)
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"] and query["client_id"] == ["tessera"]
    assert query["id_token_hint"][0].count(".") == 2  # the ID token (a JWT)
    assert signed_in_as(client) == ""
    # The provider confirms, then sends the browser back to Tessera's sign-in page.
    confirm = requests.get(out["Location"], timeout=5)
    assert confirm.status_code == 200 and "id_token_hint" in confirm.text
    back = requests.post(
        f"{sso.url}/oauth2/end_session/confirm",
        data={"redirect_uri": query["post_logout_redirect_uri"][0]},
        allow_redirects=False,
        timeout=5,
    )
    assert back.headers["Location"] == "http://testserver/login/"


@pytest.mark.django_db
def test_a_password_session_signs_out_locally(client, sso, viewer):
    assert client.post("/login/", {"username": "viewer", "password": PASSWORD}).status_code == 302
    assert client.post("/logout/")["Location"] == "/login/"


@pytest.mark.django_db
def test_with_password_sign_in_off_only_the_provider_signs_in(client, sso, settings, admin_user):
    settings.TESSERA_PASSWORD_LOGIN = False
    page = client.get("/login/").content.decode()
    assert "Sign in with Example ID" in page and 'type="password"' not in page
    refused = client.post("/login/", {"username": "admin", "password": PASSWORD})
    assert refused.status_code == 403 and "Password sign-in is turned off" in refused.content.decode()
    assert signed_in_as(client) == ""
    # Django admin's sign-in sends to Tessera's page, and its form takes no password either.
    assert client.get("/admin/login/?next=/admin/")["Location"] == "/login/?next=/admin/"
    client.post("/admin/login/", {"username": "admin", "password": PASSWORD, "next": "/admin/"})
    assert signed_in_as(client) == "" and client.get("/admin/")["Location"].startswith("/admin/login/")
    # The provider still signs in.
    sso.set_user("u-3", preferred_username="erin", groups=["tessera-admins"])
    sso_sign_in(client, sso, "u-3")
    assert signed_in_as(client) == "erin"
    assert client.get("/admin/login/").status_code == 403  # signed in, but no staff account: said, not looped


@pytest.mark.django_db
def test_switching_password_sign_in_off_ends_password_sessions(client, settings, viewer):
    assert client.post("/login/", {"username": "viewer", "password": PASSWORD}).status_code == 302
    assert signed_in_as(client) == "viewer"
    settings.TESSERA_PASSWORD_LOGIN = False
    assert signed_in_as(client) == ""


@pytest.mark.django_db
def test_api_tokens_keep_working_with_password_sign_in_off(api_client, sso, settings, operator):
    settings.TESSERA_PASSWORD_LOGIN = False
    _, token = api_token_rotate(user=operator)
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api_client.get("/api/v1/me/").json()["username"] == "operator"
    assert api_client.get("/api/v1/nodes/").status_code == 200


@pytest.mark.django_db
def test_without_configuration_there_is_no_single_sign_on(client):
    assert "Sign in with" not in client.get("/login/").content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
def test_an_unreachable_provider_is_said_on_the_sign_in_page_not_a_500(client, sso, settings, viewer):
    settings.TESSERA_SSO = {**settings.TESSERA_SSO, "ISSUER": f"http://127.0.0.1:{closed_port()}"}
    page = client.get("/login/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Single sign-on unavailable:" in text
    assert "/.well-known/openid-configuration could not be read (connection failed)" in text
    assert 'type="password"' in text  # passwords still sign in
    assert client.get("/oidc/authenticate/")["Location"] == "/login/"
    assert client.post("/login/", {"username": "viewer", "password": PASSWORD}).status_code == 302


@pytest.mark.django_db
def test_the_client_secret_is_never_shown(client, sso):
    sso.set_user("u-4", preferred_username="fred", groups=["everyone"])
    start = client.get("/oidc/authenticate/")
    pages = [start["Location"], client.get("/login/").content.decode(), sso_sign_in(client, sso, "u-4")["Location"]]
    assert not any("client-secret-for-tests" in page for page in pages)


def test_settings_that_cannot_work_are_refused_by_manage_py_check(settings):
    settings.TESSERA_SSO = {**settings.TESSERA_SSO, "ISSUER": "https://id.example.com", "ROLE_MAP": "ops=root"}
    settings.OIDC_RP_CLIENT_ID = ""
    settings.TESSERA_PASSWORD_LOGIN = False
    assert {p.id for p in sso_settings(None)} == {"tessera.E101", "tessera.E102", "tessera.E103"}
    settings.OIDC_RP_CLIENT_ID = "tessera"
    settings.TESSERA_SSO = {**settings.TESSERA_SSO, "ROLE_MAP": ""}
    assert {p.id for p in sso_settings(None)} == {"tessera.W101"}  # works, but makes accounts without a role


def test_the_policy_lets_the_sign_out_form_go_to_the_provider():
    env = {**os.environ, "TESSERA_OIDC_ISSUER": "https://id.example.com/realms/corp/"}
    code = (
        "import django, json; django.setup(); from django.conf import settings as s;"
        "print(json.dumps(s.CONTENT_SECURITY_POLICY['DIRECTIVES']['form-action']))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, check=True)
    assert json.loads(out.stdout.decode().splitlines()[-1]) == ["'self'", "https://id.example.com"]


@pytest.mark.django_db
def test_a_password_user_without_a_role_is_told_to_ask_a_tessera_admin(client):
    UserFactory(username="nobody")
    client.post("/login/", {"username": "nobody", "password": PASSWORD})
    page = client.get("/").content.decode()
    assert "Ask an admin to give you one" in page and "single sign-on" not in page
