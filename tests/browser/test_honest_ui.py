"""End to end in Chromium: relative times stay true while a page is open, list filters live in the URL (shareable,
the back button restores them), and every main page fits a 390 px phone and a 1280 px window."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PASSWORD = "pw-for-tests-1"
H100, A30 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A30"


@pytest.fixture
def small_fleet(live_server):
    """A viewer and two pools: three H100 nodes and two A30 nodes, all seen a minute ago."""
    Group.objects.get_or_create(name="viewer")
    UserFactory(username="ui-viewer", role="viewer")
    cluster = ClusterFactory(name="prod-east", connection_state="ok")
    seen = timezone.now() - timedelta(seconds=70)
    for pool_name, product, count in (("inference", H100, 3), ("batch-a30", A30, 2)):
        pool = NodePoolFactory(cluster=cluster, name=pool_name)
        for i in range(count):
            node = NodeFactory(cluster=cluster, pool=pool, name=f"{pool_name}-{i:02d}", last_seen_at=seen)
            for index in range(2):
                GpuFactory(node=node, index=index, product=product, mig_capable=True)
    return cluster


def sign_in(page, live_server, username, path="/"):
    page.goto(live_server.url + "/login/?next=" + path)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(live_server.url + path)


def test_relative_times_stay_true_while_the_page_is_open(page, live_server, small_fleet):
    page.clock.install()
    sign_in(page, live_server, "ui-viewer", "/nodes/")
    last_seen = page.locator("#node-table tbody tr").first.locator("td").last.locator("time")
    expect(last_seen).to_have_text(re.compile(r"^a minute ago$"))
    # The table shows before tessera.js (deferred) has run and started its timer: time run on before that moves
    # nothing, and the words would next change only 15 s of real time later.
    page.wait_for_load_state()
    page.clock.run_for(3 * 60 * 1000)  # three minutes later, without a reload
    expect(last_seen).to_have_text("4 minutes ago")
    page.clock.run_for(2 * 3600 * 1000)
    expect(last_seen).to_have_text("2 hours ago")


def test_list_filters_live_in_the_url_and_the_back_button_restores_them(page, live_server, small_fleet):
    sign_in(page, live_server, "ui-viewer", "/gpus/")
    rows = page.locator("#gpu-table tbody tr")
    expect(rows).to_have_count(10)
    page.get_by_label("Product").select_option(A30)
    expect(page).to_have_url(re.compile(rf"/gpus/\?product={A30}$"))
    expect(rows).to_have_count(4)
    page.get_by_label("Search").fill("batch-a30-01")
    page.get_by_label("Search").press("Enter")
    expect(page).to_have_url(re.compile(r"q=batch-a30-01"))
    expect(rows).to_have_count(2)

    # A shared link opens the same filtered list, its controls set.
    shared = page.context.new_page()
    shared.goto(page.url)
    expect(shared.locator("#gpu-table tbody tr")).to_have_count(2)
    expect(shared.get_by_label("Product")).to_have_value(A30)
    expect(shared.get_by_label("Search")).to_have_value("batch-a30-01")
    shared.close()

    # Back: the previous filters, in the table and in the controls.
    page.go_back()
    expect(page).to_have_url(re.compile(rf"/gpus/\?product={A30}$"))
    expect(rows).to_have_count(4)
    expect(page.get_by_label("Product")).to_have_value(A30)
    expect(page.get_by_label("Search")).to_have_value("")
    page.go_back()
    expect(page).to_have_url(live_server.url + "/gpus/")
    expect(rows).to_have_count(10)
    expect(page.get_by_label("Product")).to_have_value("")
    page.go_forward()
    expect(rows).to_have_count(4)
    expect(page.get_by_label("Product")).to_have_value(A30)


def test_a_search_answered_after_back_does_not_push_its_url_over_the_one_gone_back_to(page, live_server, small_fleet):
    """Typing sends the search 300 ms after the last key; Back pressed while it is on its way restores the previous
    filters, and its late answer must not push the search's URL again (tessera.js, htmx:beforeHistoryUpdate)."""
    page.add_init_script(
        "window.historyUpdates = 0;"
        "document.addEventListener('htmx:beforeHistoryUpdate', () => { window.historyUpdates += 1; });"
    )
    sign_in(page, live_server, "ui-viewer", "/gpus/")
    rows = page.locator("#gpu-table tbody tr")
    page.get_by_label("Product").select_option(A30)
    expect(page).to_have_url(re.compile(rf"/gpus/\?product={A30}$"))
    expect(rows).to_have_count(4)
    held = []
    page.route(re.compile(r"/gpus/\?.*q=late"), lambda route: held.append(route))  # answered once released
    with page.expect_request(lambda request: "q=late" in request.url):
        page.get_by_label("Search").press_sequentially("late")
    page.go_back()
    expect(page).to_have_url(live_server.url + "/gpus/")
    expect(rows).to_have_count(10)
    before = page.evaluate("window.historyUpdates")
    (late,) = held
    late.continue_()
    for _ in range(250):  # until the late answer reaches htmx's history update (wait_for_function needs eval: CSP)
        if page.evaluate("window.historyUpdates") > before:
            break
        page.wait_for_timeout(20)
    else:
        raise AssertionError("the late answer never reached htmx")
    assert page.evaluate("location.href") == live_server.url + "/gpus/"
    expect(rows).to_have_count(10)


# --- every main page at a phone's and a laptop's width ------------------------------------------------------------

WIDTHS = (390, 1280)
COLLAPSED_NAV_MAX_PX = 60


@pytest.fixture
def lab(live_server):
    """An admin and one of everything the main pages show: clusters (Kubernetes and agent), a MIG pool with pods,
    profiles, a day/night schedule, a QoS policy with its compliance report, a rollout, a join token, audit events."""
    from core.audit import Actor
    from fleet.agent_credentials import agent_join_token_create
    from scheduling import services as schedule_services
    from scheduling.services import pool_compliance_check
    from sharing import services as sharing_services
    from tests.factories import MigDeviceFactory, PodFactory
    from worker.models import Rollout

    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    admin = UserFactory(username="ui-admin", role="admin")
    actor = Actor.for_user(admin)
    ClusterFactory(name="prod-east-with-a-long-name", connection_state="ok")  # shown, never reached
    cluster = ClusterFactory(name="lab-west", driver="agent", kubeconfig_path="")  # no API server to call
    pool = NodePoolFactory(cluster=cluster, name="inference-h100-mig")
    NodePoolFactory(cluster=cluster, name="edge-l4")
    nodes = []
    for i in range(3):
        node = NodeFactory(cluster=cluster, pool=pool, name=f"inf-h100-sxm5-rack-b12-{i:02d}", observed_mode="mig")
        nodes.append(node)
        for index in range(2):
            gpu = GpuFactory(node=node, index=index, product=H100, mig_enabled=True, utilization_pct=40.0)
            MigDeviceFactory(gpu=gpu, profile="3g.40gb", start=0, size=4, in_use_by="train/llm-ft-7f")
            MigDeviceFactory(gpu=gpu, profile="1g.10gb", start=6, size=1)
        PodFactory(
            node=node, namespace="ml-serving", name=f"llama-3-8b-instruct-{i}", gpu_resources={"nvidia.com/gpu": 1}
        )
    mig = sharing_services.profile_create(
        actor=actor, name="mig-1g-x7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    whole = sharing_services.profile_create(actor=actor, name="whole-gpus", mode="passthrough", target_products=[H100])
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=mig)
    schedule = schedule_services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=mig, night_profile=whole, time_zone="Europe/Berlin", weekdays=range(7)
    )
    policy = sharing_services.qos_policy_create(actor=actor, name="latency-critical", required_qos="guaranteed")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    pool_compliance_check(pool.pk)
    rollout = Rollout.objects.filter(pool=pool).latest("pk")  # the profile's assignment rolled it out
    agent_join_token_create(actor=actor, cluster=cluster, name="rack-b12")
    return {
        "overview": "/",
        "clusters": "/clusters/",
        "cluster": f"/clusters/{cluster.pk}/",
        "pools": "/pools/",
        "pool": f"/pools/{pool.pk}/",
        "nodes": "/nodes/",
        "node": f"/nodes/{nodes[0].pk}/",
        "gpus": "/gpus/",
        "gpu": f"/gpus/{nodes[0].gpus.first().pk}/",
        "profiles": "/profiles/",
        "profile": mig.get_absolute_url(),
        "schedules": "/schedules/",
        "schedule": schedule.get_absolute_url(),
        "rollouts": "/rollouts/",
        "rollout": rollout.get_absolute_url(),
        "qos": "/qos/",
        "qos-policy": policy.get_absolute_url(),
        "compliance": "/compliance/",
        "pool-compliance": f"/pools/{pool.pk}/compliance/",
        "audit": "/audit/",
        "agent-tokens": "/agents/tokens/",
    }


@pytest.fixture
def screenshot_dir(pytestconfig):
    """test-results/screenshots/ under the repository (ignored by git): <page>-<width>.png for people to look at."""
    path = pytestconfig.rootpath / "test-results" / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.parametrize("width", WIDTHS)
def test_every_main_page_fits_the_window(page, live_server, lab, screenshot_dir, width):
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, live_server, "ui-admin")
    overflowing, tall_nav = [], []
    for name, path in lab.items():
        page.goto(live_server.url + path)
        expect(page.locator("main h1").first).to_be_visible()
        page.screenshot(path=str(screenshot_dir / f"{name}-{width}.png"), full_page=True)
        scroll_width = page.evaluate("document.documentElement.scrollWidth")
        if scroll_width > width:
            overflowing.append((name, scroll_width))
        nav_height = page.locator(".topbar").bounding_box()["height"]
        if nav_height > COLLAPSED_NAV_MAX_PX:  # folded on a phone, on one line on a laptop
            tall_nav.append((name, nav_height))
    assert overflowing == [], f"pages wider than {width} px: {overflowing}"
    assert tall_nav == [], f"the navigation bar is taller than {COLLAPSED_NAV_MAX_PX} px: {tall_nav}"


def test_on_a_phone_the_navigation_opens_from_its_button_and_tables_stack(page, live_server, lab):
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, live_server, "ui-admin", "/nodes/")
    main_nav = page.get_by_role("navigation", name="Main")
    expect(main_nav).to_be_hidden()
    page.get_by_text("Menu", exact=True).click()
    expect(main_nav).to_be_visible()
    main_nav.get_by_role("link", name="Rollouts").click()
    expect(page).to_have_url(live_server.url + "/rollouts/")
    expect(page.get_by_role("navigation", name="Main")).to_be_hidden()

    # Rows stack: each cell shows its column's name beside its value, within the window.
    page.goto(live_server.url + "/nodes/")
    cell = page.locator("#node-table tbody tr").first.locator("td").nth(1)
    expect(cell).to_have_attribute("data-label", "Cluster")
    assert cell.bounding_box()["x"] + cell.bounding_box()["width"] <= 390

    # The week timeline keeps readable labels (not squeezed to the window) and scrolls inside its own box.
    page.goto(live_server.url + lab["schedule"])
    timeline = page.locator(".timeline svg").first
    assert timeline.bounding_box()["width"] >= 700
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_at_a_laptop_width_the_navigation_is_always_open(page, live_server, lab):
    page.set_viewport_size({"width": 1280, "height": 800})
    sign_in(page, live_server, "ui-admin", "/nodes/")
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Rollouts")).to_be_visible()
    expect(page.get_by_text("Menu", exact=True)).to_be_hidden()
