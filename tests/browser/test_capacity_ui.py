"""In Chromium: a pool's capacity page draws demand against capacity per resource as SVG, says the recommendation
for the recorded week and turns it into a draft profile previewed on its nodes; GPU-hours per team draws one stacked
bar per day and group, with the reconciliation and a CSV download."""

from pathlib import Path

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from sharing.models import SharingProfile
from tests.browser.test_workflows_ui import sign_in
from tests.capacity.recorded import recorded_pool
from tests.factories import UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]
SHOTS = Path("test-results/screenshots")


@pytest.fixture
def pool(live_server):
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    UserFactory(username="ui-admin", role="admin")
    return recorded_pool(timezone.now())


def test_capacity_page_charts_the_week_and_drafts_the_recommended_profile(page, live_server, pool):
    sign_in(page, live_server, "ui-admin", f"/pools/{pool.pk}/")
    page.get_by_role("link", name="Capacity", exact=True).click()
    expect(page.get_by_role("heading", name=f"Capacity of {pool.name}")).to_be_visible()
    charts = page.locator("figure.capacity-chart")
    expect(charts).to_have_count(2)
    for resource in ("nvidia.com/gpu", "nvidia.com/mig-3g.20gb"):
        chart = page.locator(f'figure[data-resource="{resource}"] svg')
        expect(chart).to_be_visible()
        expect(page.locator(f'figure[data-resource="{resource}"] figcaption')).to_contain_text("DCGM, week mean: ")
        for series in ("capacity", "demand", "used"):
            line = chart.locator(f'polyline[data-series="{series}"]')
            assert len(line.get_attribute("points").split()) > 100  # hourly points over the week
            assert line.bounding_box()["width"] > 300  # drawn across the chart, not collapsed
    expect(page.locator("#recommendation-sentence")).to_contain_text("2 nodes at 3g.20gb ×2:")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "capacity-1440.png"), full_page=True)
    page.get_by_role("button", name="Turn into draft profile").click()
    profile = SharingProfile.objects.get()
    expect(page).to_have_url(f"{live_server.url}/profiles/{profile.pk}/preview/?nodes=" + "%2C".join(
        str(pk) for pk in pool.nodes.order_by("name").values_list("pk", flat=True)[:2]
    ))  # fmt: skip
    expect(page.get_by_text(f"Profile {profile.name} drafted")).to_be_visible()


def test_gpu_hours_page_stacks_a_bar_per_day_and_team(page, live_server, pool):
    sign_in(page, live_server, "ui-admin", "/gpu-hours/")
    page.get_by_label("Pool").select_option(str(pool.pk))
    page.get_by_label("Group by").select_option("team")
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_role("heading", name="GPU-hours per team")).to_be_visible()
    bars = page.locator("#gpu-hours-chart rect.bar")
    vision, speech = bars.and_(page.locator('[data-group="vision"]')), bars.and_(page.locator('[data-group="speech"]'))
    expect(vision).to_have_count(7)  # the week before today, every day (night use)
    assert 4 <= speech.count() <= 6  # working days of the last 7: 5, or fewer on the edges
    assert all(bars.nth(i).bounding_box()["height"] > 0 for i in range(bars.count()))
    expect(page.locator("#chart-legend")).to_contain_text("vision")
    expect(page.locator("#reconciliation")).to_contain_text("within 5 minutes")
    page.screenshot(path=str(SHOTS / "gpu-hours-1440.png"), full_page=True)
    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    assert Path(download.value.path()).read_text().startswith("day,group,resource,gpu_hours\n")
