"""WCAG 2.2 AA in Chromium: axe-core (bundled by axe-playwright-python) on every main page in its usual states, and
an admin's main flow done with the keyboard alone. docs/accessibility.md says what is checked and what is not."""

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.utils import timezone
from playwright.sync_api import expect

from core.audit import Actor
from fleet.models import Node
from scheduling import services as schedule_services
from sharing import services as sharing_services
from tests.browser import test_workflows_ui as workflows
from tests.browser.test_workflows_ui import H100, sign_in
from worker.models import Rollout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

# The WCAG 2.0, 2.1 and 2.2 A and AA rules of axe-core (best practices and AAA are not the target).
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]
# Rules switched off, each with its reason. Keep docs/accessibility.md's "Known exceptions" in step.
EXCEPTIONS: dict[str, str] = {}
AXE = Axe()

# The workflow tests' fleet (an admin, a pool of two H100 nodes) and its live rollout, as fixtures of this module too.
fleet = workflows.fleet
live_rollout = workflows.live_rollout


def axe_violations(page, state: str) -> list[str]:
    """axe's WCAG A/AA violations on the page as it is now, one line per rule: state, rule, impact, the first nodes."""
    options = {
        "runOnly": {"type": "tag", "values": WCAG_TAGS},
        "rules": {rule: {"enabled": False} for rule in EXCEPTIONS},
        "resultTypes": ["violations"],
    }
    results = AXE.run(page, options=options).response
    lines = []
    for violation in results["violations"]:
        targets = "; ".join(
            f"{' '.join(node['target'])} ({node.get('failureSummary', '').splitlines()[-1].strip()})"
            for node in violation["nodes"][:4]
        )
        lines.append(f"{state}: {violation['id']} [{violation['impact']}] ×{len(violation['nodes'])}: {targets}")
    return lines


class Audit:
    """Visits pages and collects every violation, so one run names them all (one browser page for the whole walk)."""

    def __init__(self, page, base_url):
        self.page, self.base_url, self.found = page, base_url, []

    def visit(self, path, state=None):
        response = self.page.goto(self.base_url + path)
        assert response.status < 400, f"{path}: {response.status}"
        self.check(state or path)

    def check(self, state):
        self.found += axe_violations(self.page, state)

    def assert_clean(self):
        assert not self.found, "WCAG A/AA violations:\n" + "\n".join(self.found)


@pytest.fixture
def estate(live_rollout):
    """The fleet of test_workflows_ui with its live rollout, plus a second profile, a day/night schedule on the pool,
    a QoS policy attached with a compliance report, a node drifting and a filtered audit log to look at."""
    actor = Actor.system("test")
    pool = live_rollout.pool
    profile = live_rollout.profile
    whole = sharing_services.profile_create(actor=actor, name="whole-gpus", mode="passthrough", target_products=[H100])
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    schedule = schedule_services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=profile, night_profile=whole, time_zone="Europe/Berlin", weekdays=range(5)
    )
    policy = sharing_services.qos_policy_create(actor=actor, name="inference-guaranteed", required_qos="guaranteed")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    sharing_services.qos_compliance_record(pool=pool, policy=policy)
    Node.objects.filter(pool=pool, name="inf-h100-00").update(config_state="pending", config_state_since=timezone.now())
    # Assigning and scheduling start rollouts of their own (the worker runs eagerly here): the newest one is live.
    rollout = Rollout.objects.filter(status="running").latest("pk")
    return {"rollout": rollout, "pool": pool, "profile": profile, "schedule": schedule, "policy": policy}


def test_every_main_page_has_no_wcag_violation(page, live_server, estate):
    pool, profile, schedule, policy = estate["pool"], estate["profile"], estate["schedule"], estate["policy"]
    rollout = estate["rollout"]
    node = pool.nodes.order_by("name").first()
    gpu = node.gpus.order_by("index").first()
    cluster = pool.cluster
    audit = Audit(page, live_server.url)

    page.goto(live_server.url + "/login/")
    audit.check("sign-in")
    page.get_by_label("Username").fill("ui-admin")
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Sign in").click()
    audit.check("sign-in refused")
    sign_in(page, live_server, "ui-admin", "/")
    audit.check("overview")
    for path in (
        "/clusters/",
        f"/clusters/{cluster.pk}/",
        "/pools/",
        f"/pools/{pool.pk}/",
        f"/pools/{pool.pk}/edit/",
        f"/pools/{pool.pk}/delete/",
        f"/pools/{pool.pk}/compliance/",
        f"/pools/{pool.pk}/capacity/",
        "/pools/new/",
        "/nodes/",
        "/nodes/?q=inf-h100-0",
        f"/nodes/{node.pk}/",
        "/gpus/",
        f"/gpus/{gpu.pk}/",
        "/profiles/",
        "/profiles/new/",
        f"/profiles/{profile.pk}/",
        f"/profiles/{profile.pk}/edit/",
        f"/profiles/{profile.pk}/delete/",
        f"/profiles/{profile.pk}/preview/?pool={pool.pk}",
        "/schedules/",
        "/schedules/new/",
        "/schedules/day-night/",
        f"/schedules/{schedule.pk}/",
        f"/schedules/{schedule.pk}/edit/",
        f"/schedules/{schedule.pk}/delete/",
        "/qos/",
        "/qos/new/",
        f"/qos/{policy.pk}/",
        f"/qos/{policy.pk}/edit/",
        f"/qos/{policy.pk}/delete/",
        "/compliance/",
        "/rollouts/",
        f"/rollouts/{rollout.pk}/",
        "/gpu-hours/",
        "/audit/",
        "/audit/?action=change.succeeded",
        "/account/token/",
        "/agents/tokens/",
    ):
        audit.visit(path)
    page.goto(live_server.url + "/no-such-page/")
    audit.check("page not found")
    audit.assert_clean()


def test_pages_in_their_usual_states_have_no_wcag_violation(page, live_server, estate):
    """A list filtered, forms refused with errors, a profile's layout refused as it is typed, a preview with its
    rollout strategy shown, a live rollout after a refresh, a menu open; then the phone layout with its Menu open."""
    pool, profile, rollout = estate["pool"], estate["profile"], estate["rollout"]
    audit = Audit(page, live_server.url)
    sign_in(page, live_server, "ui-admin", "/nodes/")
    page.get_by_role("searchbox").fill("inf-h100-01")
    page.get_by_role("searchbox").press("Enter")
    expect(page.locator("tbody tr")).to_have_count(1)
    audit.check("node list filtered over htmx")

    page.goto(live_server.url + "/pools/new/")
    page.get_by_role("button", name="Create pool").click()
    expect(page.locator(".field__error").first).not_to_be_empty()
    audit.check("pool editor refused")

    page.goto(live_server.url + "/profiles/new/")
    page.get_by_label("Name", exact=True).fill("too-many")
    page.get_by_label("NVIDIA H100 80GB HBM3 · 80 GiB").check()
    page.get_by_label("Layout of every GPU").fill("1g.10gb x8")
    expect(page.locator("#profile-drawings")).to_contain_text("Does not fit")
    audit.check("profile editor: layout refused live")
    page.get_by_label("Layout of every GPU").fill("1g.10gb x7")
    expect(page.locator("#profile-drawings")).to_contain_text("Fits")
    audit.check("profile editor: layout drawn live")

    page.goto(live_server.url + f"/profiles/{profile.pk}/preview/?pool={pool.pk}")
    page.get_by_label("Also roll out now").check()
    expect(page.get_by_label("Batch size")).to_be_visible()
    audit.check("preview with its rollout strategy")

    with page.expect_response(lambda response: "/live/" in response.url, timeout=8000):
        page.goto(live_server.url + f"/rollouts/{rollout.pk}/")
    audit.check("live rollout after a refresh")
    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    audit.check("rollout paused in place")

    page.get_by_label("Account menu for ui-admin").click()
    audit.check("account menu open")

    page.set_viewport_size({"width": 375, "height": 740})
    for path in ("/", "/nodes/", f"/rollouts/{rollout.pk}/", f"/schedules/{estate['schedule'].pk}/edit/"):
        audit.visit(path, f"phone {path}")
    page.get_by_text("Menu", exact=True).click()
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()
    audit.check("phone: Menu open")
    audit.assert_clean()
