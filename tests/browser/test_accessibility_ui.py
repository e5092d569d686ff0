"""WCAG 2.2 AA in Chromium: axe-core (bundled by axe-playwright-python) on every main page in its usual states, and
an admin's main flow done with the keyboard alone. docs/accessibility.md says what is checked and what is not."""

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from core.audit import Actor
from fleet.models import Node, NodePool
from scheduling import services as schedule_services
from sharing import services as sharing_services
from tests.browser import test_workflows_ui as workflows
from tests.browser.axe import axe_violations
from tests.browser.test_workflows_ui import H100, sign_in
from tests.capacity.recorded import recorded_pool
from tests.factories import GpuFactory, NodeFactory
from worker.models import NodeChange, Rollout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

# The workflow tests' fleet (an admin, a pool of two H100 nodes) and its live rollout, as fixtures of this module too.
fleet = workflows.fleet
live_rollout = workflows.live_rollout


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
    a QoS policy attached with a compliance report and a node whose change is pending: every page has content."""
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


def main_paths(estate) -> list[str]:
    """Every page of the URL confs a signed-in admin opens (their forms' and fragments' endpoints aside)."""
    pool, profile, schedule, policy = estate["pool"], estate["profile"], estate["schedule"], estate["policy"]
    rollout = estate["rollout"]
    node = pool.nodes.order_by("name").first()
    gpu = node.gpus.order_by("index").first()
    cluster = pool.cluster
    return [
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
    ]


def test_every_main_page_has_no_wcag_violation(page, live_server, estate):
    audit = Audit(page, live_server.url)

    page.goto(live_server.url + "/login/")
    audit.check("sign-in")
    page.get_by_label("Username").fill("ui-admin")
    page.get_by_label("Password").fill("wrong")
    page.get_by_role("button", name="Sign in").click()
    audit.check("sign-in refused")
    sign_in(page, live_server, "ui-admin", "/")
    audit.check("overview")
    for path in main_paths(estate):
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


def focus_is_visible(page) -> bool:
    """Whether the focused element draws a focus indicator: an outline or a ring (box-shadow) of its own."""
    return page.evaluate(
        """() => { const s = getComputedStyle(document.activeElement);
                   return (s.outlineStyle !== "none" && parseFloat(s.outlineWidth) > 0) || s.boxShadow !== "none"; }"""
    )


OUTER = "document.activeElement.outerHTML"


def tab_to(page, target, *, limit=80, key="Tab"):
    """Press Tab (or `key`) until `target` (a locator) has the focus; every stop on the way must show the focus."""
    where = "the page's start"
    if target.evaluate("el => el === document.activeElement"):
        return
    for _ in range(limit):
        page.keyboard.press(key)
        assert focus_is_visible(page), f"no visible focus after {where}: " + page.evaluate(OUTER)[:200]
        where = page.evaluate(OUTER)[:200]
        if target.evaluate("el => el === document.activeElement"):
            return
    raise AssertionError(f"{target} not reached in {limit} presses of {key}")


def enter_to_next_page(page):
    """Enter on the focused link or button, and wait for the page it leads to."""
    with page.expect_navigation():
        page.keyboard.press("Enter")


@pytest.fixture
def spare_nodes(fleet):
    """Two H100 nodes of prod-east in no pool yet, for the admin to make a pool of."""
    for i in range(2):
        node = NodeFactory(
            cluster=fleet.cluster, pool=None, name=f"trn-h100-{i:02d}", observed_device_plugin_config="whole"
        )
        for index in range(2):
            GpuFactory(node=node, index=index, product=H100)
    return sharing_services.profile_create(
        actor=Actor.system("test"),
        name="mig-1g-x7",
        mode="mig",
        target_products=[H100],
        mig_layouts={"all": {"1g.10gb": 7}},
    )


def test_an_admin_creates_a_pool_assigns_a_profile_and_pauses_its_rollout_with_the_keyboard_alone(
    page, live_server, spare_nodes
):
    profile = spare_nodes
    sign_in(page, live_server, "ui-admin", "/pools/")
    keys = page.keyboard
    # The first stop is the skip link, shown when focused; it moves the focus to the page's content.
    keys.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_in_viewport()
    keys.press("Enter")
    expect(page.locator("main")).to_be_focused()
    tab_to(page, page.get_by_role("link", name="New pool"))
    enter_to_next_page(page)

    tab_to(page, page.get_by_label("Name", exact=True))
    keys.type("training")
    tab_to(page, page.get_by_label("Cluster"))
    keys.type("prod-east")  # a closed select picks the option its typed name starts
    expect(page.get_by_label("Cluster")).to_have_value(str(Node.objects.get(name="trn-h100-00").cluster_id))
    tab_to(page, page.get_by_label("Explicit members"))
    keys.type("trn-h100-00, trn-h100-01")
    expect(page.get_by_label("Explicit members")).to_be_focused()  # the members' live preview took no focus
    tab_to(page, page.get_by_role("button", name="Create pool"))
    enter_to_next_page(page)
    expect(page.get_by_role("heading", name="training", level=1)).to_be_visible()
    pool = NodePool.objects.get(name="training")
    assert sorted(pool.nodes.values_list("name", flat=True)) == ["trn-h100-00", "trn-h100-01"]

    # To the profile through the main navigation, then its "Assign to a pool" form.
    tab_to(page, page.get_by_role("navigation", name="Main").get_by_role("link", name="Profiles"))
    enter_to_next_page(page)
    tab_to(page, page.get_by_role("link", name=profile.name))
    enter_to_next_page(page)
    tab_to(page, page.get_by_label("Pool", exact=True))
    keys.type("prod-east / training")
    expect(page.get_by_label("Pool", exact=True)).to_have_value(str(pool.pk))
    tab_to(page, page.get_by_role("button", name="Preview impact").first)
    enter_to_next_page(page)
    expect(page.get_by_role("heading", level=1)).to_contain_text("on pool training")

    tab_to(page, page.get_by_label("Also roll out now", exact=False))
    keys.press("Space")
    expect(page.get_by_label("Batch size")).to_be_visible()
    tab_to(page, page.get_by_label("Batch size"))
    keys.press("Control+A")
    keys.type("1")
    tab_to(page, page.get_by_role("button", name="Assign to pool"))
    enter_to_next_page(page)
    expect(page.get_by_role("heading", level=1)).to_contain_text("training → mig-1g-x7")
    rollout = Rollout.objects.get(pool=pool)
    assert rollout.batch_size == 1

    # Pause over htmx: the focus stays on the control, now Resume, and the 2 s refreshes leave it there.
    tab_to(page, page.get_by_role("button", name="Pause"))
    keys.press("Enter")
    resume = page.get_by_role("button", name="Resume")
    expect(resume).to_be_focused()
    assert Rollout.objects.get(pk=rollout.pk).status == "paused"
    live = page.locator("#rollout-live")
    for stop, key in (
        (resume, "Tab"),
        (live.locator("tbody a").first, "Tab"),
        (live.locator("ol.events"), "Tab"),
        (live.locator("ol.dots a").first, "Shift+Tab"),
    ):
        tab_to(page, stop, key=key)
        with page.expect_response(lambda response: "/live/" in response.url, timeout=8000):
            pass
        page.wait_for_timeout(100)
        expect(stop).to_be_focused()
        assert focus_is_visible(page)

    # The narrow layout's Menu: opened with Enter, its links next in the Tab order, closed with Escape.
    page.set_viewport_size({"width": 375, "height": 740})
    page.goto(live_server.url + "/")
    menu = page.locator("summary.navmenu__toggle")
    tab_to(page, menu)
    nav = page.get_by_role("navigation", name="Main")
    expect(nav).to_be_hidden()
    keys.press("Enter")
    expect(nav).to_be_visible()
    tab_to(page, nav.get_by_role("link", name="Overview"))
    keys.press("Escape")
    expect(nav).to_be_hidden()
    expect(menu).to_be_focused()


def test_screen_readers_hear_what_changed_and_read_every_drawing_in_words(page, live_server, estate):
    """A live rollout and a live check announce a sentence of what changed through #announcer (polite), never the
    region again; the MIG drawing, the week timeline and the capacity charts give their facts as text; colour is
    never alone (status dots and badges carry words)."""
    rollout, profile, schedule = estate["rollout"], estate["profile"], estate["schedule"]
    capacity_pool = recorded_pool(timezone.now())
    audit = Audit(page, live_server.url)
    sign_in(page, live_server, "ui-admin", f"/rollouts/{rollout.pk}/")
    announcer = page.locator("#announcer")
    expect(announcer).to_have_attribute("aria-live", "polite")
    change = rollout.changes.filter(status__in=("queued", "applying", "verifying")).order_by("position").first()
    done = rollout.changes.filter(status="succeeded").count()
    NodeChange.objects.filter(pk=change.pk).update(status="succeeded", finished_at=timezone.now())
    expect(announcer).to_contain_text(f"{done + 1} of {rollout.changes.count()} nodes done", timeout=8000)
    expect(announcer).not_to_contain_text("Strategy")  # the sentence, not the region
    for dot in page.locator("ol.dots li").all():  # each dot names its node and status in words
        assert dot.inner_text().strip(), dot.inner_html()

    # The profile editor: the refusal is read from the error slot that stays in the page (its content changes).
    page.goto(live_server.url + "/profiles/new/")
    page.locator("#err-mig_layout_all").evaluate("el => { el.dataset.marker = 'kept'; }")
    page.get_by_label("NVIDIA H100 80GB HBM3 · 80 GiB").check()
    page.get_by_label("Layout of every GPU").fill("1g.10gb x8")
    expect(page.locator("#err-mig_layout_all")).to_contain_text("has 7 compute slices")
    expect(page.locator("#err-mig_layout_all")).to_have_attribute("data-marker", "kept")
    expect(page.locator("#err-mig_layout_all")).to_have_attribute("aria-live", "polite")
    expect(announcer).to_contain_text("does not fit")

    # The MIG drawing's text alternative: each slice, where it sits, its size; the free one.
    page.goto(live_server.url + profile.get_absolute_url())
    drawing = page.locator("figure.mig svg").first
    expect(drawing).to_have_accessible_name(re.compile(r"1g\.10gb on memory slice 0 \(1 of 8\); .*; free: slice 7$"))

    # The week timeline in words: every day, its windows' times and profiles.
    page.goto(live_server.url + schedule.get_absolute_url())
    words = page.locator("details.timeline__words")
    words.locator("summary").press("Enter")
    expect(words.locator("li")).to_have_count(7)
    monday = r"Monday \d+ \w+( \(today\))?: 00:00–08:00 whole-gpus \(baseline\); 08:00–20:00 mig-1g-x7 \(day\); "
    expect(words.locator("li").first).to_have_text(re.compile(monday + r"20:00–24:00 whole-gpus \(baseline\)"))

    # The capacity charts in numbers: each day's peaks match the drawing's; open, the tables pass axe too.
    page.goto(live_server.url + f"/pools/{capacity_pool.pk}/capacity/")
    for summary in page.locator("figure.capacity-chart details summary").all():
        summary.press("Enter")
    gpu = page.locator('figure[data-resource="nvidia.com/gpu"]')
    expect(gpu.locator("table.chart-numbers tbody tr")).to_have_count(7)
    caption = gpu.locator("figcaption").inner_text()
    columns = gpu.locator("table.chart-numbers tbody tr").evaluate_all(
        "rows => rows.map(row => [...row.querySelectorAll('td.num')].map(td => Number(td.textContent)))"
    )
    peak_capacity, peak_demand = (max(day[n] for day in columns if day) for n in (0, 1))
    assert f"peak demand {peak_demand:g}, peak capacity {peak_capacity:g}" in caption, (caption, columns)
    expect(gpu.locator("table.chart-numbers tbody")).to_contain_text("within capacity")
    slices = page.locator('figure[data-resource="nvidia.com/mig-3g.20gb"] table.chart-numbers tbody')
    expect(slices).to_contain_text("above capacity")
    audit.check("capacity with its charts in numbers")
    audit.assert_clean()


# What the page's body may not do at a width: be wider than the window (WCAG 1.4.10). Tables and the week timeline
# may scroll inside their own box (two-dimensional content, allowed by 1.4.10); the page itself never.
PAGE_WIDER_THAN_WINDOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"
# The elements that reach past the window's right edge, innermost first (to name the culprit in a failure).
PAST_THE_EDGE = """() => {
  const width = document.documentElement.clientWidth + 1;
  const boxed = (el) => { for (let up = el.parentElement; up; up = up.parentElement) {
    if (!["visible", "clip"].includes(getComputedStyle(up).overflowX) && up !== document.documentElement
        && up !== document.body) return true; } return false; };
  const past = (el) => el.getBoundingClientRect().right > width && !boxed(el);
  return [...document.querySelectorAll("body *")].filter((el) => past(el) && ![...el.children].some(past))
    .slice(0, 3).map((el) => `${el.tagName} ${el.className}: ${el.textContent.trim().slice(0, 40)}`);
}"""


def test_pages_reflow_at_200_and_400_percent_zoom_and_keep_still_with_reduced_motion(page, live_server, estate):
    """640 CSS px is a 1280 px window at 200 % zoom, 320 px the 400 % of WCAG 1.4.10: no page scrolls sideways."""
    sign_in(page, live_server, "ui-admin", "/")
    wider = []
    for width in (640, 320):
        page.set_viewport_size({"width": width, "height": 720})
        for path in ["/", *main_paths(estate), "/login/"]:
            page.goto(live_server.url + path)
            overflow = page.evaluate(PAGE_WIDER_THAN_WINDOW)
            if overflow > 0:
                wider.append(f"{width} px {path}: {overflow} px wider: {page.evaluate(PAST_THE_EDGE)}")
    assert not wider, "pages wider than the window:\n" + "\n".join(wider)

    # Reduced motion: the live rollout's bars do not animate as it refreshes, nothing else moves.
    page.emulate_media(reduced_motion="reduce")
    page.set_viewport_size({"width": 1440, "height": 900})
    with page.expect_response(lambda response: "/live/" in response.url, timeout=8000):
        page.goto(live_server.url + f"/rollouts/{estate['rollout'].pk}/")
    durations = page.locator(".progress__seg, .htmx-request .table").evaluate_all(
        "els => els.map(el => getComputedStyle(el).transitionDuration)"
    )
    assert durations and set(durations) == {"0s"}, durations
    assert page.evaluate("document.getAnimations().length") == 0
