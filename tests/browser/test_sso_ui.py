"""Single sign-on in Chromium, against a real OpenID provider on loopback (oidc-provider-mock): "Sign in with …",
the provider's form, the overview as the mapped role, and signing out through the provider's end-session page, under
Tessera's Content-Security-Policy (issue 19, point 4)."""

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


@pytest.fixture
def loopback_only(page):
    """The provider's pages link a stylesheet on a CDN: nothing but loopback is reached."""

    def route(request_route):
        if urlsplit(request_route.request.url).hostname in ("localhost", "127.0.0.1"):
            request_route.continue_()
        else:
            request_route.abort()

    page.route("**/*", route)
    return page


def test_sign_in_with_the_provider_and_out_again(loopback_only, live_server, sso, settings):
    page = loopback_only
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    settings.TESSERA_PASSWORD_LOGIN = False
    sso.set_user("u-42", preferred_username="grace", groups=["everyone", "tessera-ops"])
    violations = []
    page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)

    page.goto(live_server.url + "/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    expect(page.get_by_label("Password")).to_have_count(0)  # password sign-in is off
    page.get_by_role("link", name="Sign in with Example ID").click()

    expect(page).to_have_url(re.compile(re.escape(sso.url) + "/oauth2/authorize"))
    page.get_by_placeholder("sub").fill("u-42")
    page.get_by_role("button", name="Authorize").click()

    expect(page).to_have_url(live_server.url + "/")
    expect(page.get_by_role("heading", name="Fleet overview")).to_be_visible()
    account = page.get_by_label("Account menu for grace")
    expect(account.locator(".role-chip")).to_have_text("operator")

    account.click()
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(re.escape(sso.url) + "/oauth2/end_session\\?.*id_token_hint="))
    page.get_by_role("button", name="End session").click()

    expect(page).to_have_url(live_server.url + "/login/")
    expect(page.get_by_role("link", name="Sign in with Example ID")).to_be_visible()
    page.goto(live_server.url + "/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))  # signed out of Tessera too
    assert violations == []
