"""End to end in Chromium under the Content-Security-Policy (no inline script): the pages, their HTMX parts, the API
docs and Django's admin run without a single violation; the API token is shown once and selected on focus; a user
without a role is told to ask an admin (issue 15, points 4, 8 and 10)."""

import re

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PASSWORD = "pw-for-tests-1"
PAGES = ["/", "/nodes/", "/gpus/", "/clusters/", "/pools/", "/profiles/", "/profiles/new/", "/schedules/", "/qos/",
         "/rollouts/", "/audit/", "/account/token/", "/admin/", "/admin/fleet/cluster/add/"]  # fmt: skip


@pytest.fixture
def fleet(live_server):
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    UserFactory(username="ui-admin", role="admin", is_staff=True, is_superuser=True)
    cluster = ClusterFactory(name="prod-east", driver="agent", kubeconfig_path="", connection_state="ok")
    pool = NodePoolFactory(cluster=cluster, name="inference")
    GpuFactory(node=NodeFactory(cluster=cluster, pool=pool, name="gpu-node-01"), product="NVIDIA-H100-80GB-HBM3")
    return pool


def sign_in(page, live_server, username):
    page.goto(live_server.url + "/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()


def watch_violations(page) -> list[str]:
    seen = []
    page.on("console", lambda m: seen.append(m.text) if "Content Security Policy" in m.text else None)
    return seen


def test_no_page_breaks_the_content_security_policy(page, live_server, fleet):
    violations = watch_violations(page)
    sign_in(page, live_server, "ui-admin")
    for path in PAGES:
        response = page.goto(live_server.url + path)
        assert response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"], path
        page.wait_for_load_state("networkidle")
    # HTMX at work under the policy: filtering the node table swaps it in place.
    page.goto(live_server.url + "/nodes/")
    page.get_by_role("searchbox").first.fill("gpu-node-01")
    expect(page.get_by_role("link", name="gpu-node-01")).to_be_visible()
    assert violations == []


def test_the_api_docs_render_under_the_policy(page, live_server, fleet):
    violations = watch_violations(page)
    sign_in(page, live_server, "ui-admin")
    page.goto(live_server.url + "/api/docs/")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible(timeout=15_000)
    page.goto(live_server.url + "/api/redoc/")
    expect(page.get_by_text("Tessera API").first).to_be_visible(timeout=15_000)
    # Redoc's sidebar links its vendor's logo on a CDN: refusing that is the policy working, nothing breaks.
    assert [v for v in violations if "cdn.redoc.ly" not in v] == [], violations


def test_the_api_token_is_shown_once_and_selected_on_focus(page, live_server, fleet):
    violations = watch_violations(page)
    sign_in(page, live_server, "ui-admin")
    page.goto(live_server.url + "/account/token/")
    page.get_by_role("button", name="Make a token").click()
    field = page.get_by_role("textbox", name="Token")
    token = field.input_value()
    assert re.fullmatch(r"tst_[0-9a-f]{12}_[\w-]{43}", token)
    field.focus()
    assert page.evaluate("(f => f.value.slice(f.selectionStart, f.selectionEnd))(document.activeElement)") == token
    page.goto(live_server.url + "/account/token/")
    expect(page.locator("body")).not_to_contain_text(token)
    expect(page.get_by_role("button", name="Rotate token")).to_be_visible()
    assert violations == []


def test_a_user_without_a_role_is_told_to_ask_an_admin(page, live_server, fleet):
    UserFactory(username="newcomer")
    sign_in(page, live_server, "newcomer")
    expect(page.get_by_role("heading", name="Your account has no role yet")).to_be_visible()
    expect(page.locator("main")).to_contain_text("Ask an admin")
