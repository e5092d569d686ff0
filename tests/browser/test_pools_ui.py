"""End to end in Chromium, as an admin: a pool created from the UI with the members its selector matches shown as
the selector is typed, refused while it overlaps another pool, edited and deleted; then a profile assigned to a
pool whose schedule window is in force now, choosing each of the three things the admin may mean."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from core.audit import Actor
from core.models import AuditEvent
from fleet.models import NodePool
from scheduling import services as scheduling_services
from scheduling.models import Schedule
from sharing import services as sharing_services
from sharing.models import NodePin, PoolSharing
from tests.browser.test_workflows_ui import H100, sign_in
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


@pytest.fixture
def cluster(live_server):
    """An admin; cluster prod-east with pool inference (2 nodes by selector) and 3 training nodes in no pool."""
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    UserFactory(username="ui-admin", role="admin")
    cluster = ClusterFactory(name="prod-east", driver="agent", kubeconfig_path="", connection_state="ok")
    inference = NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference")
    for role, count, pool in (("inference", 2, inference), ("training", 3, None)):
        for i in range(count):
            node = NodeFactory(
                cluster=cluster,
                pool=pool,
                name=f"{role[:3]}-h100-{i:02d}",
                labels={"tessera.io/pool": role},
                observed_device_plugin_config="whole",
                allocatable={"nvidia.com/gpu": 2},
            )
            for index in range(2):
                GpuFactory(node=node, index=index, product=H100)
    return cluster


def test_create_a_pool_seeing_its_members_live_refused_on_overlap_then_edit_and_delete(page, live_server, cluster):
    sharing_services.profile_create(
        actor=Actor.system("test"), name="whole", mode="passthrough", target_products=[H100]
    )
    sign_in(page, live_server, "ui-admin", "/pools/")
    page.get_by_role("link", name="New pool").click()
    expect(page.get_by_role("heading", name="New pool", level=1)).to_be_visible()
    page.evaluate("window.tesseraMarker = 'same page'")
    page.get_by_label("Name", exact=True).fill("training")
    page.get_by_label("Cluster").select_option(label="prod-east")
    selector = page.get_by_label("Label selector")
    selector.press_sequentially("tessera.io/pool", delay=20)
    members = page.locator("#pool-members")
    expect(members.locator("#members-count")).to_have_text("5 nodes")
    expect(members.locator("#members-overlaps")).to_contain_text(
        "Overlaps pool inference: both would select 2 nodes: inf-h100-00, inf-h100-01."
    )
    page.screenshot(path="/tmp/tessera-pool-editor-overlap.png", full_page=True)

    page.get_by_role("button", name="Create pool").click()
    expect(page.get_by_role("alert").filter(has_text="Not saved")).to_contain_text("Overlaps pool inference")
    expect(page.locator("#err-node_selector")).to_contain_text("both would select 2 nodes: inf-h100-00, inf-h100-01")
    assert not NodePool.objects.filter(name="training").exists()

    page.evaluate("window.tesseraMarker = 'same page'")
    selector.fill("tessera.io/pool=training")
    expect(members.locator("#members-count")).to_have_text("3 nodes")
    expect(members.locator("#members-names")).to_contain_text("tra-h100-02")
    expect(members.locator("#members-overlaps")).to_have_count(0)
    assert page.evaluate("window.tesseraMarker") == "same page"
    page.get_by_label("Default profile").select_option(label="whole")
    page.screenshot(path="/tmp/tessera-pool-editor.png", full_page=True)
    page.get_by_role("button", name="Create pool").click()

    expect(page.get_by_role("heading", name="training", level=1)).to_be_visible()
    expect(page.locator(".messages")).to_contain_text("Pool training saved.")
    expect(page.locator("#pool-default")).to_contain_text("whole")
    expect(page.locator("#pool-why")).to_contain_text("the pool's default")
    pool = NodePool.objects.get(name="training")
    assert pool.nodes.count() == 3 and PoolSharing.objects.get(pool=pool).profile.name == "whole"

    page.get_by_role("link", name="Edit pool").click()
    expect(page.locator("#members-count")).to_have_text("3 nodes")
    page.get_by_label("Description").fill("Batch training, H100")
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator(".messages")).to_contain_text("Pool training saved.")
    expect(page.get_by_text("Batch training, H100")).to_be_visible()

    page.get_by_role("link", name="Delete").click()
    expect(page.get_by_role("heading", name="Delete training?")).to_be_visible()
    expect(page.locator("form.confirm")).to_contain_text("3 nodes belong to no pool after")
    page.get_by_role("button", name="Delete pool").click()
    expect(page.locator(".messages")).to_contain_text("Pool training deleted.")
    expect(page.get_by_role("link", name="training")).to_have_count(0)
    actions = list(AuditEvent.objects.filter(object_type="nodepool").order_by("pk").values_list("action", flat=True))
    assert actions == ["pool.create", "pool.members", "pool.set_profile", "pool.update", "pool.delete"]


@pytest.fixture
def window_now(cluster):
    """Pool inference under schedule day-night, whose window `day` (every day, UTC) is in force now and ends at the
    next full hour after the next one; outside it the pool's default applies (no baseline)."""
    actor = Actor.system("test")
    mig = sharing_services.profile_create(
        actor=actor, name="mig-day", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    now = datetime.now(UTC)
    ends = (now + timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
    start, end = (now - timedelta(hours=1)).replace(minute=0, second=0, microsecond=0).time(), ends.time()
    until = ends.strftime("%H:%M UTC" if ends.date() == now.date() else "%a %H:%M UTC")  # as scheduling.assign says it
    pool = NodePool.objects.get(name="inference")
    scheduling_services.schedule_create(
        actor=actor,
        pool=pool,
        name="day-night",
        time_zone="UTC",
        windows=[{"name": "day", "weekdays": list(range(7)), "start": start, "end": end, "profile": mig}],
    )
    ts = sharing_services.profile_create(
        actor=actor, name="ts-4", mode="time_slicing", target_products=[H100], replicas=4
    )
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    return pool, ts, whole, until


def _preview(page, live_server, profile, pool):
    page.goto(f"{live_server.url}/profiles/{profile.pk}/preview/?pool={pool.pk}")
    expect(page.get_by_role("heading", level=1)).to_contain_text("on pool inference")


def test_assign_while_a_window_rules_offers_default_window_or_pin(page, live_server, window_now):
    pool, ts, whole, until = window_now
    sign_in(page, live_server, "ui-admin", "/")

    # 1. The pool's default: the page says the schedule keeps its profile until the window ends.
    _preview(page, live_server, ts, pool)
    rule = page.locator("#schedule-rule")
    expect(rule).to_contain_text("The schedule day-night sets mig-day (window day (Mon–Sun ")
    expect(rule).to_contain_text(f"until {until}; your profile applies from then.")
    page.screenshot(path="/tmp/tessera-assign-under-schedule.png", full_page=True)
    expect(page.get_by_label("Change the pool's default to ts-4")).to_be_checked()
    page.get_by_role("button", name="Assign to pool").click()
    expect(page.locator(".messages")).to_contain_text(f"until {until}; your profile applies from then.")
    assert PoolSharing.objects.get(pool=pool).profile == ts

    # 2. Pin the nodes until the next transition: the pool page shows the pins and their end.
    _preview(page, live_server, whole, pool)
    page.get_by_label("Pin the pool's nodes to whole until the schedule's next transition").check()
    page.get_by_role("button", name="Assign to pool").click()
    expect(page.get_by_role("heading", name="inference", level=1)).to_be_visible()
    expect(page.locator(".messages")).to_contain_text(f"2 nodes of pool inference pinned to whole until {until}")
    expect(page.locator("#pool-now")).to_contain_text("2 nodes run their own pin instead")
    assert NodePin.objects.filter(profile=whole, until__isnull=False).count() == 2
    NodePin.objects.all().delete()

    # 3. Change the window's profile: the schedule sets ts-4 now, and the pool page says why.
    _preview(page, live_server, ts, pool)
    page.get_by_label("Change the schedule: window day").check()
    page.get_by_role("button", name="Assign to pool").click()
    expect(page.locator(".messages")).to_contain_text("of schedule day-night now sets ts-4")
    expect(page.locator("#pool-why")).to_contain_text("The schedule day-night sets ts-4 (window day")
    assert Schedule.objects.get().windows.get().profile == ts
    page.screenshot(path="/tmp/tessera-pool-page.png", full_page=True)

    # Rolling out a new default now is refused with the reason, and the page offers the other choices.
    _preview(page, live_server, whole, pool)
    page.get_by_label("Also roll out now").check()
    page.get_by_role("button", name="Assign to pool").click()
    expect(page.locator("#err-rollout-now")).to_contain_text(
        "Nothing to roll out now: The schedule day-night sets ts-4"
    )
    expect(page.get_by_label("Pin the pool's nodes to whole until the schedule's next transition")).to_be_visible()


def test_a_selector_typed_while_the_page_loads_its_scripts_still_shows_its_members(page, live_server, cluster):
    """On a slow link the form shows before htmx has taken it over; what was typed by then is previewed after."""
    sign_in(page, live_server, "ui-admin", "/pools/")
    held = []
    page.route("**/htmx-2*.js", lambda route: held.append(route))  # routing also bypasses the HTTP cache
    page.goto(live_server.url + "/pools/new/", wait_until="commit")
    page.get_by_label("Cluster").select_option(label="prod-east")
    page.get_by_label("Label selector").fill("tessera.io/pool=training")
    while not held:
        page.wait_for_timeout(20)
    expect(page.locator("#pool-members")).to_contain_text("Choose a cluster and type a label selector")
    held[0].continue_()
    expect(page.locator("#members-count")).to_have_text("3 nodes")
    expect(page.locator("#members-names")).to_contain_text("tra-h100-02")
