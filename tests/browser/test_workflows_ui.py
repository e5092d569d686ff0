"""End to end in Chromium: a MIG profile validated live and assigned through its preview, a day/night schedule and
its week timeline, and a rollout page that follows the rollout without reloading."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from core.audit import Actor
from core.models import AuditEvent
from scheduling.models import Schedule
from sharing import services as sharing_services
from sharing.models import PoolSharing
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory, PodFactory, UserFactory
from worker.models import NodeChange, Rollout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PASSWORD = "pw-for-tests-1"
H100 = "NVIDIA-H100-80GB-HBM3"
SCREENSHOTS = {
    "editor": "/tmp/tessera-profile-editor.png",
    "preview": "/tmp/tessera-preview.png",
    "profile": "/tmp/tessera-profile.png",
    "schedule": "/tmp/tessera-schedule.png",
    "schedule_editor": "/tmp/tessera-schedule-editor.png",
    "schedule_impact": "/tmp/tessera-schedule-impact.png",
    "rollout": "/tmp/tessera-rollout.png",
    "node": "/tmp/tessera-node-desired.png",
    "audit": "/tmp/tessera-audit.png",
    "overview": "/tmp/tessera-overview-upcoming.png",
}


@pytest.fixture
def fleet(live_server):
    """An admin, an operator, and a pool of two H100 nodes (agent driver: no cluster to reach) running whole GPUs."""
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    UserFactory(username="ui-admin", role="admin")
    UserFactory(username="ui-operator", role="operator")
    cluster = ClusterFactory(name="prod-east", driver="agent", kubeconfig_path="", connection_state="ok")
    pool = NodePoolFactory(cluster=cluster, name="inference")
    for i in range(2):
        node = NodeFactory(
            cluster=cluster,
            pool=pool,
            name=f"inf-h100-{i:02d}",
            observed_device_plugin_config="whole",
            allocatable={"nvidia.com/gpu": 2},
        )
        for index in range(2):
            GpuFactory(node=node, index=index, product=H100)
    PodFactory(node=node, namespace="ml", name="llama-serve-0", gpu_resources={"nvidia.com/gpu": 1})
    return pool


def sign_in(page, live_server, username, path="/"):
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(live_server.url + "/login/?next=" + path)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(live_server.url + path)


def test_create_a_mig_profile_validated_live_then_assign_it_through_the_preview(page, live_server, fleet):
    sign_in(page, live_server, "ui-admin", "/profiles/new/")
    page.evaluate("window.tesseraMarker = 'same page'")
    page.get_by_label("Name", exact=True).fill("mig-1g-x7")
    page.get_by_label("NVIDIA H100 80GB HBM3 · 80 GiB").check()
    layout = page.get_by_label("Layout of every GPU")
    layout.fill("1g.10gb x8")
    errors = page.locator("#err-mig_layout_all")
    expect(errors).to_contain_text("NVIDIA-H100-80GB-HBM3 has 7 compute slices; 1g.10gb × 8 needs 8")
    expect(page.locator("#profile-drawings")).to_contain_text("Does not fit")
    expect(page.locator("#profile-drawings rect.mig-device")).to_have_count(0)
    page.screenshot(path="/tmp/tessera-profile-editor-refused.png")

    layout.fill("1g.10gb x7")
    expect(page.locator("#profile-drawings rect.mig-device")).to_have_count(7)
    expect(page.locator("#profile-drawings rect.mig-free")).to_have_count(1)
    expect(page.locator("#profile-drawings")).to_contain_text("Fits")
    expect(errors).to_have_text("")
    assert page.evaluate("window.tesseraMarker") == "same page"
    # MPS-only fields are hidden for a MIG profile, shown when the mode changes.
    expect(page.get_by_label("Active thread percentage (%)")).to_be_hidden()
    page.screenshot(path=SCREENSHOTS["editor"], full_page=True)

    page.get_by_role("button", name="Create profile").click()
    expect(page.get_by_role("heading", name="mig-1g-x7", level=1)).to_be_visible()
    expect(page.locator("figure.mig rect.mig-device")).to_have_count(7)
    page.screenshot(path=SCREENSHOTS["profile"], full_page=True)

    assign = page.locator("section", has=page.get_by_role("heading", name="Assign to a pool"))
    assign.get_by_label("Pool").select_option(label="prod-east / inference")
    assign.get_by_role("button", name="Preview impact").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("on pool inference")
    expect(page.locator(".impact-table")).to_contain_text("nvidia.com/mig-1g.10gb: 14")
    expect(page.locator(".impact-table")).to_contain_text("nvidia.com/gpu: 2")
    expect(page.locator(".impact-table")).to_contain_text("ml/llama-serve-0")
    expect(page.get_by_label("Batch size")).to_be_hidden()
    page.get_by_label(re.compile("Also roll out now")).check()
    page.get_by_label("Batch size").fill("1")
    page.get_by_label("Busy GPUs").select_option("drain")
    page.screenshot(path=SCREENSHOTS["preview"], full_page=True)

    page.get_by_role("button", name="Assign to pool").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("inference → mig-1g-x7 (2 nodes)")
    expect(page.locator(".messages")).to_contain_text("now the default profile of pool inference")
    assert PoolSharing.objects.get(pool=fleet).profile.name == "mig-1g-x7"
    rollout = Rollout.objects.get()
    assert (rollout.batch_size, rollout.busy_policy, rollout.actor_label) == (1, "drain", "ui-admin")


def test_day_night_schedule_from_the_preset_shows_the_week(page, live_server, fleet):
    actor = Actor.system("test")
    sharing_services.profile_create(
        actor=actor, name="mig-1g-x7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sharing_services.profile_create(actor=actor, name="whole-gpus", mode="passthrough", target_products=[H100])
    sign_in(page, live_server, "ui-admin", "/schedules/day-night/")
    page.get_by_label("Pool").select_option(label="prod-east / inference")
    page.get_by_label("Day profile").select_option(label="mig-1g-x7")
    page.get_by_label("Night profile").select_option(label="whole-gpus")
    page.get_by_label("Time zone").fill("Europe/Berlin")
    expect(page.get_by_label("Mon")).to_be_checked()
    expect(page.get_by_label("Sat")).not_to_be_checked()
    page.get_by_role("button", name="Create schedule").click()
    expect(page.locator("#save-impact")).to_be_visible()  # the impact first; nothing saved yet
    assert not Schedule.objects.exists()
    page.get_by_role("button", name="Confirm and create").click()

    expect(page.get_by_role("heading", name="inference day/night", level=1)).to_be_visible()
    timeline = page.locator("figure.timeline svg")
    expect(timeline.locator("rect.tl-seg")).to_have_count(5 * 3 + 2)
    expect(timeline.locator('rect.tl-seg[data-profile="mig-1g-x7"]')).to_have_count(5)
    day = timeline.locator('rect.tl-seg[data-profile="mig-1g-x7"]').first
    assert (day.get_attribute("x"), day.get_attribute("width")) == ("336.0", "360.0")
    expect(timeline.locator("rect.tl-today")).to_have_count(1)
    expect(page.locator("figure.timeline")).to_contain_text("Times in Europe/Berlin; you are viewing in UTC")
    expect(page.locator("figure.timeline .legend")).to_contain_text("whole-gpus (baseline)")
    page.screenshot(path=SCREENSHOTS["schedule"], full_page=True)

    # The editor redraws the week as the admin types, without saving or reloading.
    page.get_by_role("link", name="Edit").click()
    page.evaluate("window.tesseraMarker = 'same page'")
    expect(page.locator("#timeline-preview rect.tl-seg")).to_have_count(17)
    page.get_by_role("group", name="Days the window starts on").first.get_by_text("Sat").click()
    expect(page.locator('#timeline-preview rect.tl-seg[data-profile="mig-1g-x7"]')).to_have_count(6)
    assert page.evaluate("window.tesseraMarker") == "same page"
    page.screenshot(path=SCREENSHOTS["schedule_editor"], full_page=True)


def test_saving_a_preset_shows_its_impact_and_asks_to_confirm(page, live_server, fleet):
    actor = Actor.system("test")
    sharing_services.profile_create(
        actor=actor, name="mig-1g-x7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sharing_services.profile_create(actor=actor, name="whole-gpus", mode="passthrough", target_products=[H100])
    now = timezone.now()  # a day window running now (UTC), ending in two hours, every day
    sign_in(page, live_server, "ui-admin", "/schedules/day-night/")
    page.get_by_label("Pool").select_option(label="prod-east / inference")
    page.get_by_label("Day profile").select_option(label="mig-1g-x7")
    page.get_by_label("Night profile").select_option(label="whole-gpus")
    page.get_by_label("Time zone").fill("UTC")
    page.get_by_label("Day starts").fill(f"{now - timedelta(hours=1):%H:%M}")
    page.get_by_label("Day ends").fill(f"{now + timedelta(hours=2):%H:%M}")
    for day in ("Sat", "Sun"):
        page.get_by_label(day).check()
    page.get_by_role("button", name="Create schedule").click()

    impact = page.locator("#save-impact")
    expect(impact).to_be_visible()
    at_once = impact.locator('[data-when="now"]')
    expect(at_once).to_contain_text("At once, when saved: mig-1g-x7")
    expect(at_once.locator(".impact-counts")).to_contain_text("2 of 2 nodes change")
    expect(at_once.locator(".impact-counts")).to_contain_text("4 GPU resets on 2 nodes")
    expect(at_once.locator(".impact-counts")).to_contain_text("1 pod loses its GPU slice")
    expect(at_once.locator("table")).to_contain_text("ml/llama-serve-0")
    expect(impact.locator('[data-when="transition"]')).to_contain_text("Next switch")
    expect(impact.locator('[data-when="transition"]')).to_contain_text("whole-gpus")
    page.screenshot(path=SCREENSHOTS["schedule_impact"], full_page=True)
    assert not Schedule.objects.exists() and not Rollout.objects.exists()

    # A change after the preview is previewed again, not saved.
    page.get_by_label("Wait up to (minutes)").fill("10")
    page.get_by_role("button", name="Confirm and create").click()
    expect(page.locator("#save-impact")).to_be_visible()
    assert not Schedule.objects.exists()
    page.get_by_role("button", name="Confirm and create").click()
    expect(page.get_by_role("heading", name="inference day/night", level=1)).to_be_visible()
    assert Schedule.objects.get().wait_minutes == 10


@pytest.fixture
def live_rollout(fleet):
    """A running rollout of mig-1g-x7 over six nodes of the pool: 2 succeeded, 1 verifying, 1 applying, 2 queued."""
    profile = sharing_services.profile_create(
        actor=Actor.system("test"),
        name="mig-1g-x7",
        mode="mig",
        target_products=[H100],
        mig_layouts={"all": {"1g.10gb": 7}},
    )
    rollout = Rollout.objects.create(
        title="inference → mig-1g-x7 (6 nodes)",
        trigger="user",
        actor_label="ui-operator",
        pool=fleet,
        profile=profile,
        batch_size=2,
        canary_count=1,
        max_failures=2,
    )
    nodes = list(fleet.nodes.all())
    for i in range(4):
        nodes.append(NodeFactory(cluster=fleet.cluster, pool=fleet, name=f"inf-h100-{i + 2:02d}"))
    statuses = ["succeeded", "succeeded", "verifying", "applying", "queued", "queued"]
    for position, (node, status) in enumerate(zip(nodes, statuses, strict=True)):
        change = NodeChange.objects.create(
            rollout=rollout,
            node=node,
            position=position,
            status=status,
            profile=profile,
            attempts=int(status != "queued"),
            applied_mig_config="tessera-mig-4f2a9c",
            to_config={"profile": profile.name, "mig_config": "tessera-mig-4f2a9c"},
            started_at=timezone.now() if status != "queued" else None,
        )
        if status != "queued":
            AuditEvent.objects.create(
                at=timezone.now(),
                actor_kind="system",
                actor_label="tessera-worker",
                action=f"change.{status}",
                object_type="nodechange",
                object_id=str(change.pk),
                object_repr=f"{node.name} (rollout #{rollout.pk})",
                before={"status": "queued"},
                after={"status": status},
            )
    return rollout


def test_rollout_page_follows_progress_without_reloading(page, live_server, live_rollout):
    rollout = live_rollout
    sign_in(page, live_server, "ui-operator", f"/rollouts/{rollout.pk}/")
    page.evaluate("window.tesseraMarker = 'same page'")
    progress = page.locator(".progress__text").first
    expect(progress).to_contain_text("2/6")
    expect(page.locator("ol.dots li")).to_have_count(6)
    expect(page.locator("ol.dots li.dot--succeeded")).to_have_count(2)
    expect(page.get_by_role("button", name="Pause")).to_be_visible()

    verifying = rollout.changes.get(status="verifying")
    NodeChange.objects.filter(pk=verifying.pk).update(status="succeeded", finished_at=timezone.now())
    AuditEvent.objects.create(
        at=timezone.now(),
        actor_kind="system",
        actor_label="tessera-worker",
        action="change.succeeded",
        object_type="nodechange",
        object_id=str(verifying.pk),
        object_repr=f"{verifying.node.name} (rollout #{rollout.pk})",
        before={"status": "verifying"},
        after={"status": "succeeded"},
    )
    expect(progress).to_contain_text("3/6", timeout=8000)
    expect(page.locator("ol.dots li.dot--succeeded")).to_have_count(3)
    expect(page.locator(".events")).to_contain_text("verifying → succeeded")
    assert page.evaluate("window.tesseraMarker") == "same page"
    page.screenshot(path=SCREENSHOTS["rollout"], full_page=True)

    # Pause over HTMX: the live section answers, still without a reload.
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#rollout-live")).to_contain_text("Paused")
    expect(page.get_by_role("button", name="Resume")).to_be_visible()
    assert page.evaluate("window.tesseraMarker") == "same page"
    assert Rollout.objects.get(pk=rollout.pk).status == "paused"


def test_a_click_just_after_the_live_section_refreshes_is_handled_in_place(page, live_server, live_rollout):
    """The live section is replaced every 2 s. A click in the very next moment reaches a form htmx has taken over:
    Cancel asks first, and is never posted as a plain form without asking."""
    sign_in(page, live_server, "ui-operator", f"/rollouts/{live_rollout.pk}/")
    expect(page.get_by_role("button", name="Cancel rollout")).to_be_visible()
    page.evaluate("window.tesseraMarker = 'same page'")
    page.on("dialog", lambda dialog: dialog.dismiss())
    with page.expect_event("dialog", timeout=8000) as asked:
        page.evaluate(
            """() => document.body.addEventListener("htmx:afterSwap", () => setTimeout(() =>
                document.querySelector("#rollout-live .btn--danger").click()), {once: true})"""
        )
    assert asked.value.message.startswith(f"Cancel rollout #{live_rollout.pk}?")
    assert page.evaluate("window.tesseraMarker") == "same page"
    assert Rollout.objects.get(pk=live_rollout.pk).status == "running"


def test_screenshots_of_node_lists_audit_and_overview(page, live_server, fleet):
    """Not a workflow: the node page's desired-vs-observed card, the lists, the audit log and the overview panel."""
    from scheduling import services as schedule_services

    actor = Actor.system("test")
    profile = sharing_services.profile_create(
        actor=actor, name="mig-1g-x7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    whole = sharing_services.profile_create(actor=actor, name="whole-gpus", mode="passthrough", target_products=[H100])
    node = fleet.nodes.order_by("name").first()
    node.config_state = "pending"
    node.config_state_since = timezone.now()
    node.save()
    PoolSharing.objects.create(pool=fleet, profile=profile)
    schedule_services.schedule_create_day_night(
        actor=actor,
        pool=fleet,
        day_profile=profile,
        night_profile=whole,
        time_zone="Europe/Berlin",
        weekdays=range(7),
    )
    sign_in(page, live_server, "ui-operator", f"/nodes/{node.pk}/")
    expect(page.locator(".desired-card")).to_contain_text("Drift")
    page.screenshot(path=SCREENSHOTS["node"], full_page=True)
    page.goto(live_server.url + "/")
    expect(page.locator("#upcoming-heading")).to_be_visible()
    expect(page.locator("section", has=page.locator("#upcoming-heading")).locator("tbody tr")).to_have_count(4)
    page.screenshot(path=SCREENSHOTS["overview"], full_page=True)
    for path, shot in (
        ("/audit/", "audit"),
        ("/profiles/", "profiles"),
        ("/rollouts/", "rollouts"),
        ("/schedules/", "schedules"),
    ):
        page.goto(live_server.url + path)
        page.screenshot(path=f"/tmp/tessera-{shot}.png", full_page=True)
