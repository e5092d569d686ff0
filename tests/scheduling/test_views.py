"""Schedule pages: list (now / next), editor with formsets and service errors per field, the day/night preset, the
week timeline SVG, the schedule page (transitions, next impact), the overview's upcoming panel; roles on POSTs."""

import re
from datetime import UTC, datetime, time

import pytest
from django.urls import reverse

from fleet.models import Cluster
from scheduling import services
from scheduling.kueue import kueue_binding_set
from scheduling.models import Schedule
from scheduling.timeline import TL_HOUR, TL_LABEL, value_labeller, week_timeline
from sharing import services as sharing_services
from sharing.models import PoolSharing, QoSPolicy
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db

H100 = "NVIDIA-H100-80GB-HBM3"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def pool():
    pool = NodePoolFactory(name="inference", cluster=ClusterFactory(name="east"))
    for i in range(3):
        node = NodeFactory(cluster=pool.cluster, pool=pool, name=f"inf-{i}", allocatable={"nvidia.com/gpu": 2})
        for index in range(2):
            GpuFactory(node=node, index=index)
    return pool


def login(client, user):
    client.force_login(user)
    return client


def day_night(actor, pool, profiles, zone="UTC", **kwargs):
    mig, whole = profiles
    return services.schedule_create_day_night(
        actor=actor, pool=pool, day_profile=mig, night_profile=whole, time_zone=zone, **kwargs
    )


def timeline_rects(html: str) -> list[dict]:
    """Segments of the week timeline: day, x, width, profile."""
    rows = re.findall(r'<g class="tl-row[^"]*" data-day="([^"]+)">(.*?)</g>', html, re.S)
    found = []
    for day, body in rows:
        for attrs in re.findall(r'<rect class="tl-seg ([^"]*)"([^>]*)>', body):
            values = dict(re.findall(r'([\w-]+)="([^"]*)"', attrs[1]))
            found.append(
                {
                    "day": day,
                    "x": float(values["x"]),
                    "width": float(values["width"]),
                    "profile": values["data-profile"],
                }
            )
    return found


def formset_data(prefix: str, rows: list[dict]) -> dict:
    data = {
        f"{prefix}-TOTAL_FORMS": str(len(rows)),
        f"{prefix}-INITIAL_FORMS": "0",
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for i, row in enumerate(rows):
        for key, value in row.items():
            data[f"{prefix}-{i}-{key}"] = value
    return data


def editor_data(pool, windows, exceptions=(), **overrides) -> dict:
    data = {
        "name": "inference hours",
        "pool": pool.pk,
        "time_zone": "Europe/Berlin",
        "baseline_profile": "",
        "busy_policy": "wait",
        "wait_minutes": "30",
        "enabled": "on",
        **formset_data("windows", windows),
        **formset_data("exceptions", list(exceptions)),
    }
    data.update(overrides)
    return data


# --- access ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,args",
    [
        ("scheduling:schedule_list", []),
        ("scheduling:schedule_create", []),
        ("scheduling:schedule_daynight", []),
        ("scheduling:schedule_detail", [1]),
        ("scheduling:schedule_update", [1]),
        ("scheduling:schedule_delete", [1]),
    ],
)
def test_pages_need_login(client, name, args):
    response = client.get(reverse(name, args=args))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize(
    "name,with_pk",
    [
        ("scheduling:schedule_create", False),
        ("scheduling:schedule_daynight", False),
        ("scheduling:schedule_timeline", False),
        ("scheduling:schedule_update", True),
        ("scheduling:schedule_delete", True),
    ],
)
def test_every_post_is_admin_only(client, viewer, operator, actor, pool, profiles, name, with_pk):
    schedule = day_night(actor, pool, profiles)
    url = reverse(name, args=[schedule.pk]) if with_pk else reverse(name)
    for user in (viewer, operator):
        login(client, user)
        assert client.post(url, {"name": "x"}).status_code == 403
        assert client.get(reverse("scheduling:schedule_list")).status_code == 200
    assert Schedule.objects.get().name == "inference day/night"


def test_buttons_only_for_admins(client, operator, admin_user, actor, pool, profiles):
    schedule = day_night(actor, pool, profiles)
    html = login(client, operator).get(schedule.get_absolute_url()).content.decode()
    assert f'href="/schedules/{schedule.pk}/edit/"' not in html
    assert (
        'href="/schedules/new/"'
        not in login(client, operator).get(reverse("scheduling:schedule_list")).content.decode()
    )
    html = login(client, admin_user).get(schedule.get_absolute_url()).content.decode()
    assert f'href="/schedules/{schedule.pk}/edit/"' in html


# --- the week timeline -----------------------------------------------------------------------------------------


def test_day_night_timeline_segments_are_proportional(actor, pool, profiles):
    schedule = day_night(actor, pool, profiles)
    now = datetime(2026, 3, 11, 10, 30, tzinfo=UTC)  # a Wednesday
    timeline = week_timeline(schedule.to_calendar(), value_labeller({p.pk: p.name for p in profiles}, {}), now=now)
    monday, friday, saturday = timeline["rows"][0], timeline["rows"][4], timeline["rows"][5]
    assert str(monday["day"]) == "2026-03-09" and timeline["rows"][2]["today"]
    for row in (monday, friday):
        night, day, evening = row["segments"]
        assert (night["x"], night["width"], night["label"]) == (TL_LABEL, 8 * TL_HOUR, "whole")
        assert (day["x"], day["width"], day["label"], day["window"]) == (
            TL_LABEL + 8 * TL_HOUR,
            12 * TL_HOUR,
            "mig-7",
            "day",
        )
        assert (evening["x"], evening["width"]) == (TL_LABEL + 20 * TL_HOUR, 4 * TL_HOUR)
    (whole_day,) = saturday["segments"]
    assert (whole_day["x"], whole_day["width"], whole_day["label"]) == (TL_LABEL, 24 * TL_HOUR, "whole")
    assert timeline["now"]["x"] == TL_LABEL + 10.5 * TL_HOUR
    assert [e["label"] for e in timeline["legend"]] == ["whole", "mig-7"]


def test_schedule_page_draws_the_week(client, viewer, actor, pool, profiles):
    schedule = day_night(actor, pool, profiles)
    html = login(client, viewer).get(schedule.get_absolute_url()).content.decode()
    rects = timeline_rects(html)
    assert len(rects) == 5 * 3 + 2  # weekdays: night, day, evening; weekend: one baseline run
    days = [r for r in rects if r["profile"] == "mig-7"]
    assert len(days) == 5 and all((r["x"], r["width"]) == (TL_LABEL + 240, 360) for r in days)
    assert html.count('class="tl-today"') == 1 and 'class="tl-now"' in html
    assert "Times in UTC." in html and "you are viewing in" not in html
    assert 'whole <span class="faint">(baseline)</span>' in html and 'mig-7 <span class="faint">(day)</span>' in html


def test_timeline_says_when_zones_differ(client, viewer, actor, pool, profiles):
    schedule = day_night(actor, pool, profiles, zone="Europe/Berlin")
    html = login(client, viewer).get(schedule.get_absolute_url()).content.decode()
    assert "Times in Europe/Berlin; you are viewing in UTC" in html


def test_pool_default_shows_in_the_legend(actor, pool, profiles):
    mig, whole = profiles
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=whole)
    schedule = services.schedule_create(
        actor=actor,
        pool=pool,
        name="days",
        time_zone="UTC",
        windows=[{"name": "day", "weekdays": [0], "start": time(8), "end": time(20), "profile": mig}],
    )
    label = value_labeller({mig.pk: "mig-7"}, {}, PoolSharing.objects.get(pool=pool))
    timeline = week_timeline(schedule.to_calendar(), label)
    assert timeline["legend"][0] == {"colour": "default", "label": "Pool default (whole)", "notes": ["baseline"]}


# --- list and page ---------------------------------------------------------------------------------------------


def test_list_shows_now_and_next(client, viewer, actor, pool, profiles):
    day_night(actor, pool, profiles, zone="Asia/Tokyo")
    html = login(client, viewer).get(reverse("scheduling:schedule_list")).content.decode()
    assert "inference day/night" in html and "Asia/Tokyo" in html
    assert ("whole" in html or "mig-7" in html) and "→" in html
    assert re.search(r"\w{3} \d\d:\d\d Asia/Tokyo", html)  # the next change in the schedule's zone too


@pytest.mark.parametrize("count", [1, 12])
def test_list_query_count_is_bounded(client, viewer, actor, profiles, django_assert_max_num_queries, count):
    for i in range(count):
        day_night(actor, NodePoolFactory(name=f"p{i}"), profiles)
    login(client, viewer)
    # session, user, role; schedules; windows; exceptions; pool defaults
    with django_assert_max_num_queries(8):
        assert client.get(reverse("scheduling:schedule_list")).status_code == 200


def test_schedule_page_lists_transitions_and_the_next_impact(client, viewer, actor, pool, profiles):
    schedule = day_night(actor, pool, profiles, weekdays=list(range(7)))
    html = login(client, viewer).get(schedule.get_absolute_url()).content.decode()
    assert "Changes in the next 7 days" in html and "3 unpinned nodes follow each change" in html
    assert html.count('<td class="num">3</td>') == 14  # two switches a day
    assert "Impact of the next change" in html and f"?pool={pool.pk}" in html
    assert "GPU reset" in html


def test_the_next_changes_gpu_resets_are_counted_in_gpus_over_nodes(
    client, viewer, actor, pool, profiles, time_machine
):
    """At night the next change is the day's MIG layout: each of the 6 whole GPUs resets, on 3 nodes (the previews'
    count); the page once showed the nodes' count as GPUs."""
    time_machine.move_to(datetime(2026, 11, 30, 2, 0, tzinfo=UTC), tick=False)  # a Monday, before the day window
    schedule = day_night(actor, pool, profiles, weekdays=list(range(7)))
    html = login(client, viewer).get(schedule.get_absolute_url()).content.decode()
    assert re.search(r'impact-counts__value">6</span> GPU resets on 3 nodes</li>', html)


def test_schedule_page_shows_kueue_quota_before_and_after_each_transition(client, viewer, actor, pool, profiles):
    schedule = day_night(actor, pool, profiles, weekdays=list(range(7)))
    html = login(client, viewer).get(schedule.get_absolute_url()).content.decode()
    assert "Kueue quota" not in html  # no binding: no column
    kueue_binding_set(actor=actor, pool=pool, cluster_queues=["gpu"])
    html = login(client, viewer).get(schedule.get_absolute_url()).content.decode()
    assert "Kueue quota (before → after)" in html
    # 3 nodes × 2 H100s: 6 whole GPUs ↔ 42 slices of 1g.10gb, every switch in one direction or the other.
    assert (
        html.count("<code>nvidia.com/gpu</code> 6 → <strong>0</strong>")
        + html.count("<code>nvidia.com/gpu</code> 0 → <strong>6</strong>")
        == 14
    )
    assert "<code>nvidia.com/mig-1g.10gb</code> 0 → <strong>42</strong>" in html
    assert "tessera-inference-nvidia-h100-80gb-hbm3" in html


def test_next_impact_says_when_the_clusters_mig_strategy_now_refuses_the_profile(client, viewer, actor, pool, profiles):
    mig, _ = profiles
    halves = sharing_services.profile_create(
        actor=actor, name="mig-3g", mode="mig", target_products=[H100], mig_layouts={"all": {"3g.40gb": 2}}
    )
    schedule = day_night(actor, pool, (mig, halves), weekdays=list(range(7)))  # every change is to a MIG profile
    Cluster.objects.filter(pk=pool.cluster_id).update(mig_strategy="none")  # the ClusterPolicy changed since
    response = login(client, viewer).get(schedule.get_absolute_url())
    assert response.status_code == 200
    assert "cluster east&#x27;s ClusterPolicy sets spec.mig.strategy=none" in response.content.decode()


# --- editor ----------------------------------------------------------------------------------------------------


def confirmed(client, url, data):
    """Save as a person does: the impact first (nothing written), then "Confirm and save" with what was previewed."""
    count = Schedule.objects.count()
    preview = client.post(url, data)
    assert preview.status_code == 200 and b'id="save-impact"' in preview.content
    assert Schedule.objects.count() == count
    return client.post(url, {**data, "action": "save", "previewed": preview.context["previewed"]})


WEEKDAY_WINDOW = {"name": "day", "weekdays": ["0", "1", "2", "3", "4"], "start": "08:00", "end": "20:00"}


def test_create_with_windows_and_exceptions(client, admin_user, pool, profiles):
    mig, whole = profiles
    data = editor_data(
        pool,
        [{**WEEKDAY_WINDOW, "profile": mig.pk}, {"name": "", "start": "", "end": "", "profile": ""}],
        [{"date": "2026-12-25", "note": "Christmas"}],
        baseline_profile=whole.pk,
    )
    response = confirmed(login(client, admin_user), reverse("scheduling:schedule_create"), data)
    schedule = Schedule.objects.get()
    assert response.status_code == 302 and response["Location"] == schedule.get_absolute_url()
    (window,) = schedule.windows.all()
    assert (window.weekdays, window.start, window.end, window.profile) == ([0, 1, 2, 3, 4], time(8), time(20), mig)
    assert (schedule.time_zone, schedule.baseline_profile, str(schedule.exceptions.get().date)) == (
        "Europe/Berlin",
        whole,
        "2026-12-25",
    )


def test_overlapping_windows_name_both(client, admin_user, pool, profiles):
    mig, whole = profiles
    windows = [
        {**WEEKDAY_WINDOW, "profile": mig.pk},
        {"name": "evening", "weekdays": ["2"], "start": "18:00", "end": "22:00", "profile": whole.pk},
    ]
    response = login(client, admin_user).post(reverse("scheduling:schedule_create"), editor_data(pool, windows))
    html = response.content.decode()
    assert response.status_code == 400 and not Schedule.objects.exists()
    assert "Windows &#x27;day&#x27; (Mon–Fri 08:00–20:00) and &#x27;evening&#x27; (Wed 18:00–22:00) overlap" in html


def test_window_without_weekdays_is_shown_on_its_row(client, admin_user, pool, profiles):
    mig, _ = profiles
    windows = [{"name": "day", "start": "08:00", "end": "20:00", "profile": mig.pk}]
    html = login(client, admin_user).post(reverse("scheduling:schedule_create"), editor_data(pool, windows)).content
    html = html.decode()
    assert re.search(r'id="err-windows-0-weekdays"><p>Pick at least one weekday', html)


def test_bad_zone_and_second_schedule_errors_on_their_fields(client, admin_user, actor, pool, profiles):
    mig, _ = profiles
    windows = [{**WEEKDAY_WINDOW, "profile": mig.pk}]
    login(client, admin_user)
    html = client.post(reverse("scheduling:schedule_create"), editor_data(pool, windows, time_zone="Mars/Olympus"))
    assert re.search(r'id="err-time_zone" aria-live="polite"><p>.*Mars/Olympus', html.content.decode())
    day_night(actor, pool, profiles)
    response = client.post(reverse("scheduling:schedule_create"), editor_data(pool, windows))
    assert response.status_code == 409
    assert re.search(
        r'id="err-pool" aria-live="polite"><p>Pool inference already has a schedule', response.content.decode()
    )


def test_profile_not_fitting_the_pool_is_refused(client, admin_user, actor, pool):
    a30 = sharing_services.profile_create(
        actor=actor, name="a30-split", mode="mig", target_products=["NVIDIA-A30"], mig_layouts={"all": {"1g.6gb": 4}}
    )
    windows = [{**WEEKDAY_WINDOW, "profile": a30.pk}]
    response = login(client, admin_user).post(reverse("scheduling:schedule_create"), editor_data(pool, windows))
    assert response.status_code == 400 and b"a30-split does not fit" in response.content
    assert b"the profile targets NVIDIA-A30; the node has NVIDIA-H100-80GB-HBM3" in response.content


def test_edit_keeps_the_pool_and_replaces_windows(client, admin_user, actor, pool, profiles):
    schedule = day_night(actor, pool, profiles)
    mig, whole = profiles
    login(client, admin_user)
    html = client.get(reverse("scheduling:schedule_update", args=[schedule.pk])).content.decode()
    assert 'value="08:00"' in html and 'value="20:00"' in html and "disabled" in html
    windows = [{"name": "late", "weekdays": ["5", "6"], "start": "22:00", "end": "06:00", "profile": mig.pk}]
    data = editor_data(NodePoolFactory(), windows, name="weekend nights", baseline_profile=whole.pk)
    response = confirmed(client, reverse("scheduling:schedule_update", args=[schedule.pk]), data)
    assert response.status_code == 302
    schedule.refresh_from_db()
    assert (schedule.name, schedule.pool, schedule.windows.get().name) == ("weekend nights", pool, "late")


def test_editor_posts_the_form_for_a_live_timeline(client, admin_user, pool, profiles):
    mig, whole = profiles
    login(client, admin_user)
    html = client.get(reverse("scheduling:schedule_create")).content.decode()
    assert 'hx-post="/schedules/timeline/"' in html and 'hx-target="#timeline-preview"' in html
    assert '<datalist id="common-time-zones">' in html and '<option value="Europe/Berlin">' in html
    data = editor_data(pool, [{**WEEKDAY_WINDOW, "profile": mig.pk}], baseline_profile=whole.pk, time_zone="UTC")
    html = client.post(reverse("scheduling:schedule_timeline"), data, **HTMX).content.decode()
    assert html.lstrip().startswith('<section id="timeline-preview"') and "<html" not in html
    assert len([r for r in timeline_rects(html) if r["profile"] == "mig-7"]) == 5
    bad = [{**WEEKDAY_WINDOW, "profile": mig.pk}, {**WEEKDAY_WINDOW, "name": "copy", "profile": whole.pk}]
    html = client.post(reverse("scheduling:schedule_timeline"), editor_data(pool, bad), **HTMX).content.decode()
    assert "Not a valid week yet" in html and "overlap" in html


def test_day_night_preset_creates_a_plain_schedule(client, admin_user, pool, profiles):
    mig, whole = profiles
    inference = QoSPolicy.objects.create(name="inference", transparent_hugepages="never")
    data = {
        "pool": pool.pk,
        "day_profile": mig.pk,
        "night_profile": whole.pk,
        "day_qos_policy": inference.pk,
        "night_qos_policy": "",
        "time_zone": "Europe/Berlin",
        "day_start": "07:00",
        "day_end": "19:00",
        "weekdays": ["0", "1", "2", "3", "4"],
        "name": "",
        "busy_policy": "drain",
        "wait_minutes": "15",
    }
    response = confirmed(login(client, admin_user), reverse("scheduling:schedule_daynight"), data)
    schedule = Schedule.objects.get()
    assert response["Location"] == schedule.get_absolute_url()
    assert (schedule.name, schedule.baseline_profile, schedule.busy_policy, schedule.wait_minutes) == (
        "inference day/night",
        whole,
        "drain",
        15,
    )
    window = schedule.windows.get()
    assert (window.start, window.profile, window.qos_policy) == (time(7), mig, inference)
    assert schedule.baseline_qos_policy is None
    response = client.post(reverse("scheduling:schedule_daynight"), data)
    assert response.status_code == 409 and b"already has a schedule" in response.content


def test_delete_returns_the_pool_to_its_default(client, admin_user, actor, pool, profiles):
    schedule = day_night(actor, pool, profiles)
    login(client, admin_user)
    assert (
        b"goes back to its default profile"
        in client.get(reverse("scheduling:schedule_delete", args=[schedule.pk])).content
    )
    assert client.post(reverse("scheduling:schedule_delete", args=[schedule.pk])).status_code == 302
    assert not Schedule.objects.exists()


# --- the overview's upcoming changes ---------------------------------------------------------------------------


def test_the_overview_lists_six_upcoming_changes_of_a_schedule_at_most(client, viewer, actor, pool, profiles):
    """A schedule with a window every hour (the demo of `make run` switches every 2 minutes) leaves the overview
    readable: its first six changes, the rest on its own page."""
    mig, whole = profiles
    hourly = [
        {"name": f"h{hour}", "weekdays": list(range(7)), "start": time(hour, 0), "end": time(hour, 30), "profile": mig}
        for hour in range(24)
    ]
    services.schedule_create(actor=actor, pool=pool, name="hourly", baseline_profile=whole, windows=hourly)
    login(client, viewer)
    html = client.get(reverse("console:overview")).content.decode()
    section = html[html.index("upcoming-heading") : html.index("nodes-heading")]
    assert section.count("<tr>") == 1 + 6 and "at most 6 per schedule" in section


def test_overview_lists_upcoming_changes(client, viewer, actor, pool, profiles):
    login(client, viewer)
    html = client.get(reverse("console:overview")).content.decode()
    assert "No schedule changes in the next 48 h" in html
    day_night(actor, pool, profiles, zone="Asia/Tokyo", weekdays=list(range(7)))
    html = client.get(reverse("console:overview")).content.decode()
    assert "Upcoming schedule changes" in html and "No schedule changes" not in html
    section = html[html.index("upcoming-heading") : html.index("nodes-heading")]
    assert section.count("<tr>") == 1 + 4  # header and four switches in 48 h
    assert "Asia/Tokyo" in section and "mig-7" in section and "whole" in section
    assert '<td class="num">3</td>' in section
