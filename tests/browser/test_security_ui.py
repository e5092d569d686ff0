"""End to end in Chromium under the Content-Security-Policy (no inline script): the pages, their HTMX parts, the API
docs and Django's admin run without a single violation, a console error or a request off the server; the API token is
shown once and selected on focus; a user without a role is told to ask an admin (issue 15, points 4, 8 and 10;
issue 17, point 10)."""

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from fleet.models import UuidConflict
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
    assert violations == []


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


def watch_console_and_requests(page, live_server) -> tuple[list[str], list[str]]:
    """Console errors and uncaught exceptions, and every request to a host other than the server's."""
    errors, outside = [], []
    here = urlsplit(live_server.url).netloc
    page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
    page.on("request", lambda r: outside.append(r.url) if urlsplit(r.url).netloc not in ("", here) else None)
    return errors, outside


def retrigger_twice(field) -> None:
    """Two live checks in the same tick, the second while the first is in flight: the case that aborted a request
    (and logged htmx:sendAbort) while live checks used hx-sync "replace"."""
    field.evaluate("f => { for (const _ of [1, 2]) f.dispatchEvent(new Event('change', {bubbles: true})); }")


def test_main_pages_and_live_checks_fetch_nothing_outside_and_log_no_error(page, live_server, fleet):
    errors, outside = watch_console_and_requests(page, live_server)
    sign_in(page, live_server, "ui-admin")
    node = fleet.nodes.get()
    for path in [*PAGES, "/api/docs/", f"/nodes/{node.pk}/", f"/gpus/{node.gpus.get().pk}/", f"/pools/{fleet.pk}/",
                 "/qos/new/", "/schedules/new/", "/schedules/day-night/", "/compliance/"]:  # fmt: skip
        assert page.goto(live_server.url + path).status == 200, path
        page.wait_for_load_state("networkidle")
    # Pages without an icon link (Django's admin, Swagger UI) make the browser ask for /favicon.ico: the logo.
    assert page.goto(live_server.url + "/favicon.ico").headers["content-type"] == "image/svg+xml"

    page.goto(live_server.url + "/profiles/new/")
    page.get_by_label("NVIDIA H100 80GB HBM3 · 80 GiB").check()
    layout = page.get_by_label("Layout of every GPU")
    layout.press_sequentially("1g.10gb x7", delay=40)
    retrigger_twice(layout)
    expect(page.locator("#profile-drawings")).to_contain_text("1g.10gb")

    page.goto(live_server.url + "/qos/new/")
    page.get_by_label("Locked GPU clock, min").press_sequentially("1500", delay=40)
    clock_max = page.get_by_label("Locked GPU clock, max")
    clock_max.press_sequentially("1200", delay=40)
    retrigger_twice(clock_max)
    expect(page.locator("#err-gpu_clock_max_mhz")).to_have_text("The maximum clock must be at least the minimum.")

    page.goto(live_server.url + "/schedules/new/")
    zone = page.get_by_label("Time zone")
    zone.fill("")
    zone.press_sequentially("Europe/Berlin", delay=40)
    retrigger_twice(zone)
    expect(page.locator("#timeline-preview")).to_contain_text("Europe/Berlin")

    page.goto(live_server.url + "/nodes/")
    search = page.get_by_role("searchbox").first
    search.press_sequentially("gpu-node-01", delay=40)
    retrigger_twice(page.get_by_label("Cluster"))
    expect(page.get_by_role("link", name="gpu-node-01")).to_be_visible()
    page.wait_for_load_state("networkidle")
    assert errors == [] and outside == [], (errors, outside)


def test_an_admin_settles_a_gpu_uuid_conflict_from_the_node_page(page, live_server, fleet):
    holder = fleet.nodes.get()
    gpu = holder.gpus.get()
    reporter = NodeFactory(cluster=fleet.cluster, pool=fleet, name="gpu-node-02")
    now = timezone.now()
    UuidConflict.objects.create(node=reporter, holder=holder, uuid=gpu.uuid, kind="gpu", first_seen_at=now,
                                last_seen_at=now)  # fmt: skip
    sign_in(page, live_server, "ui-admin")
    page.goto(f"{live_server.url}/nodes/{holder.pk}/")
    callout = page.locator("#uuid-conflicts")
    expect(callout).to_contain_text(gpu.uuid)
    callout.get_by_role("button", name="Give it to gpu-node-02").click()
    expect(page.get_by_text(f"GPU {gpu.uuid} now belongs to node gpu-node-02.")).to_be_visible()
    assert page.url == f"{live_server.url}/nodes/{holder.pk}/"
    expect(page.locator("#uuid-conflicts")).to_have_count(0)
    gpu.refresh_from_db()
    assert gpu.gone_at is not None
