"""The capacity page (chart, recommendation, drafts) and GPU-hours per team: page, CSV and API."""

import csv
import io
from datetime import UTC, datetime

import pytest
from django.urls import reverse
from django.utils import timezone

from capacity import selectors
from capacity.models import DemandSample, DemandSource
from sharing.models import SharingProfile
from tests.capacity.recorded import A100, recorded_pool

pytestmark = pytest.mark.django_db
END = datetime(2025, 3, 10, 0, 0, tzinfo=UTC)  # a Monday: the week before is Mon 3 … Sun 9 March


def test_the_recommendation_on_the_recorded_week_is_the_known_best():
    pool = recorded_pool(END)
    result = selectors.recommendation(pool, selectors.Window(), selectors.week_demand(pool, END))
    assert result.best.label == "2 nodes at 3g.20gb ×2"
    assert (result.best.started_within_5min, result.best.waiting) == (result.best.waiting, 180)
    assert (result.today.started_within_5min, result.today.idle_pct, result.best.idle_pct) == (60, 50.0, 0.0)


def test_the_capacity_page_draws_each_resource_and_says_the_recommendation(client, viewer):
    pool = recorded_pool(timezone.now())
    client.force_login(viewer)
    page = client.get(reverse("capacity:pool_capacity", args=[pool.pk])).content.decode()
    assert page.count('class="capacity-chart"') == 2
    assert 'data-resource="nvidia.com/gpu"' in page and 'data-resource="nvidia.com/mig-3g.20gb"' in page
    assert "2 nodes at 3g.20gb ×2: " in page
    assert "Turn into draft profile" not in page  # viewers read only
    refused = client.get(reverse("capacity:pool_capacity", args=[pool.pk]), {"start": "08:00", "end": "20:00",
                                                                             "time_zone": "Mars/Olympus"})  # fmt: skip
    assert "is no IANA time zone" in refused.content.decode()


def test_each_chart_says_the_weeks_dcgm_utilisation_and_memory(client, viewer):
    pool = recorded_pool(timezone.now())
    samples = DemandSample.objects.filter(pool=pool, source=DemandSource.PODS)
    samples.update(utilization_pct=None, memory_used_pct=None)
    first, second = samples.filter(resource="nvidia.com/gpu").order_by("-at")[:2]
    DemandSample.objects.filter(pk=first.pk).update(utilization_pct=30.0, memory_used_pct=50.0)
    DemandSample.objects.filter(pk=second.pk).update(utilization_pct=50.0)  # no memory reading: left out of its mean
    client.force_login(viewer)
    page = client.get(reverse("capacity:pool_capacity", args=[pool.pk])).content.decode()
    whole, mig = (
        page.split('data-resource="nvidia.com/gpu"')[1],
        page.split('data-resource="nvidia.com/mig-3g.20gb"')[1],
    )
    assert "DCGM, week mean: utilisation 40 %, memory in use 50 %</span>" in whole.split("</figcaption>")[0]
    assert "DCGM, week mean: no reading</span>" in mig.split("</figcaption>")[0]


def test_an_admin_turns_the_recommendation_into_a_draft_profile_previewed_on_its_nodes(client, admin_user):
    pool = recorded_pool(END)
    client.force_login(admin_user)
    form = {"kind": "profile", "layout": "3g.20gb ×2", "nodes": 2, "weekdays": [0, 1, 2, 3, 4],
            "start": "08:00", "end": "20:00", "time_zone": "UTC"}  # fmt: skip
    response = client.post(reverse("capacity:pool_capacity_draft", args=[pool.pk]), form)
    profile = SharingProfile.objects.get()
    assert (profile.mode, profile.mig_layouts, profile.target_products) == ("mig", {"all": {"3g.20gb": 2}}, [A100])
    nodes = ",".join(str(pk) for pk in pool.nodes.order_by("name").values_list("pk", flat=True)[:2])
    assert response["Location"] == f"/profiles/{profile.pk}/preview/?nodes={nodes.replace(',', '%2C')}"
    assert client.get(response["Location"]).status_code == 200

    schedule = client.post(reverse("capacity:pool_capacity_draft", args=[pool.pk]), {**form, "kind": "schedule"})
    second = SharingProfile.objects.exclude(pk=profile.pk).get()
    assert second.name == f"{profile.name}-2"
    assert schedule["Location"].startswith("/schedules/new/?pool=")
    editor = client.get(schedule["Location"]).content.decode()
    assert 'value="08:00"' in editor and 'value="20:00"' in editor and f'value="{second.pk}" selected' in editor


def test_gpu_hours_api_per_team_reconciles_and_answers_csv(viewer_api):
    pool = recorded_pool(END)
    query = {"pool": pool.pk, "from": "2025-03-03", "to": "2025-03-09", "group_by": "team"}
    answer = viewer_api.get("/api/v1/gpu-hours/", query).json()
    monday = {r["group"]: r["gpu_hours"] for r in answer["rows"] if r["day"] == "2025-03-03"}
    assert monday == {"vision": 3 * 12 + 8 * 11, "speech": 12.0}  # 01:00–07:00 and 20:00–23:00 by night
    check = answer["reconciliation"]
    assert check["groups_gpu_hours"] == pytest.approx(check["pool_used_gpu_hours"])
    assert check["difference_gpu_hours"] == 0 and check["sample_minutes"] == 5
    text = viewer_api.get("/api/v1/gpu-hours/", {**query, "format": "csv"})
    assert text["Content-Type"].startswith("text/csv")
    lines = list(csv.DictReader(io.StringIO(text.content.decode())))
    assert lines[0].keys() == {"day", "group", "resource", "gpu_hours"}
    assert sum(float(line["gpu_hours"]) for line in lines) == pytest.approx(check["groups_gpu_hours"])


@pytest.mark.parametrize(
    ("query", "field"),
    [({"from": "2025-03-09", "to": "2025-03-01"}, "to"), ({"group_by": "cluster"}, "group_by"),
     ({"pool": 999999}, "pool"), ({"from": "yesterday"}, "from"), ({"from": "2024-01-01", "to": "2025-03-01"}, "to")],
)  # fmt: skip
def test_gpu_hours_api_refuses_bad_queries_per_field(viewer_api, query, field):
    response = viewer_api.get("/api/v1/gpu-hours/", query)
    assert response.status_code == 400
    body = response.json()
    assert body["message"] and list(body["errors"]) == [field]


def test_gpu_hours_page_stacks_days_by_team_and_downloads_csv(client, viewer):
    pool = recorded_pool(END)
    client.force_login(viewer)
    query = {"pool": pool.pk, "start": "2025-03-03", "end": "2025-03-09", "group_by": "team"}
    page = client.get(reverse("capacity:gpu_hours"), query).content.decode()
    assert page.count('data-group="vision"') == 7 and page.count('data-group="speech"') == 5
    assert "The groups sum to" in page and "within 5 minutes" in page
    download = client.get(reverse("capacity:gpu_hours"), {**query, "download": "csv"})
    assert download["Content-Disposition"] == 'attachment; filename="gpu-hours-2025-03-03-2025-03-09.csv"'
    assert download.content.decode().startswith("day,group,resource,gpu_hours\n2025-03-03,speech,nvidia.com/gpu,12.0")


def test_a_bad_query_asking_for_csv_answers_the_json_error(admin_client):
    response = admin_client.get("/api/v1/gpu-hours/?format=csv&from=yesterday")
    assert response.status_code == 400 and response["Content-Type"] == "application/json"
    assert set(response.json()["errors"]) == {"from"}


def test_options_asking_for_csv_answers_json(admin_client):
    """Schemathesis' coverage phase (issue 25, point 5): OPTIONS with `format=csv` was a 500 (the CSV renderer got
    the endpoint's description, not rows)."""
    response = admin_client.options("/api/v1/gpu-hours/?format=csv")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response.json()["name"]
