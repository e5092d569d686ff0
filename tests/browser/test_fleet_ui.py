"""End to end in Chromium: sign in, filter the node table in place over HTMX, open a node and see its MIG layout."""

import re

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from tests.factories import ClusterFactory, GpuFactory, MigDeviceFactory, NodeFactory, NodePoolFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PASSWORD = "pw-for-tests-1"
SCREENSHOTS = {"overview": "/tmp/tessera-overview.png", "node": "/tmp/tessera-node.png"}


@pytest.fixture
def fleet(live_server):
    """A viewer and a small mixed fleet: three H100 nodes in MIG mode and two A30 nodes."""
    Group.objects.get_or_create(name="viewer")
    UserFactory(username="ui-viewer", role="viewer")
    cluster = ClusterFactory(name="prod-east", connection_state="ok")
    inference = NodePoolFactory(cluster=cluster, name="inference")
    batch = NodePoolFactory(cluster=cluster, name="batch-a30")
    for i in range(3):
        node = NodeFactory(
            cluster=cluster,
            pool=inference,
            name=f"inf-h100-{i:02d}",
            observed_mode="mig",
            observed_mig_config="all-balanced",
        )
        for index in range(2):
            gpu = GpuFactory(node=node, index=index, mig_enabled=True, utilization_pct=30.0 + 20 * index)
            MigDeviceFactory(gpu=gpu, profile="3g.40gb", start=0, size=4, in_use_by="train/llm-ft-7f")
            MigDeviceFactory(gpu=gpu, profile="2g.20gb", start=4, size=2)
            MigDeviceFactory(gpu=gpu, profile="1g.10gb", start=6, size=1)
    for i in range(2):
        node = NodeFactory(cluster=cluster, pool=batch, name=f"a30-{i:02d}", observed_mode="time_slicing")
        for index in range(4):
            GpuFactory(node=node, index=index, product="NVIDIA-A30", memory_mib=24576, mig_capable=True)
    return cluster


def sign_in(page, live_server):
    page.goto(live_server.url + "/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
    page.get_by_label("Username").fill("ui-viewer")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(live_server.url + "/")
    expect(page.get_by_role("heading", name="Fleet overview")).to_be_visible()


def test_filter_nodes_in_place_and_open_a_node(page, live_server, fleet):
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, live_server)
    rows = page.locator("#node-table tbody tr")
    expect(rows).to_have_count(5)
    page.screenshot(path=SCREENSHOTS["overview"], full_page=True)

    # A marker on the window object survives only if the page is not reloaded.
    page.evaluate("window.tesseraMarker = 'same page'")
    page.get_by_label("GPU product").select_option("NVIDIA-A30")
    expect(page).to_have_url(re.compile(r"\?product=NVIDIA-A30$"))
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("a30-00")
    assert page.evaluate("window.tesseraMarker") == "same page"

    page.get_by_label("Search").press_sequentially("a30-01")
    expect(rows).to_have_count(1)
    expect(page).to_have_url(re.compile(r"q=a30-01"))
    assert page.evaluate("window.tesseraMarker") == "same page"

    page.get_by_label("GPU product").select_option("")
    page.get_by_label("Search").fill("")
    page.get_by_label("Search").press("Enter")
    expect(rows).to_have_count(5)
    page.get_by_role("link", name="inf-h100-01").click()
    expect(page.get_by_role("heading", name="inf-h100-01", level=1)).to_be_visible()
    drawings = page.locator("figure.mig svg")
    expect(drawings).to_have_count(2)
    expect(drawings.first.locator("rect.mig-device")).to_have_count(3)
    expect(drawings.first.locator("rect.mig-free")).to_have_count(1)
    expect(page.locator("figure.mig").first).to_contain_text("3g.40gb × 1")
    page.screenshot(path=SCREENSHOTS["node"], full_page=True)


def test_filters_work_without_javascript(browser, live_server, fleet):
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(live_server.url + "/login/")
    page.get_by_label("Username").fill("ui-viewer")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.goto(live_server.url + "/nodes/")
    page.get_by_label("GPU product").select_option("NVIDIA-A30")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"/nodes/\?.*product=NVIDIA-A30"))
    expect(page.locator("#node-table tbody tr")).to_have_count(2)
    context.close()
