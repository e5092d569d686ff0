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
