"""The audit log page: filters (who, action prefix, object type, since/until), HTMX in-place table, pagination,
compact before → after; and the shared helpers of UI views (roles, redirects after a change)."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from core.models import AuditEvent
from core.views import audit_diff

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def event(action, *, who="admin", kind="user", object_type="sharingprofile", object_id="1", ago=0, **kwargs):
    return AuditEvent.objects.create(
        at=timezone.now() - timedelta(minutes=ago),
        actor_kind=kind,
        actor_label=who,
        action=action,
        object_type=object_type,
        object_id=object_id,
        object_repr=kwargs.pop("repr", f"{object_type} {object_id}"),
        **kwargs,
    )


def actions(html: str) -> list[str]:
    return re.findall(r'<td><span class="mono small">([\w.]+)</span></td>', html)


@pytest.fixture
def client_viewer(client, viewer):
    client.force_login(viewer)
    return client


def test_audit_log_needs_login(client):
    response = client.get(reverse("audit_log"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_nav_links_every_page(client_viewer):
    html = client_viewer.get(reverse("audit_log")).content.decode()
    for href in ('href="/profiles/"', 'href="/schedules/"', 'href="/rollouts/"', 'href="/audit/" aria-current="page"'):
        assert href in html


def test_audit_log_shows_who_what_object_and_diff(client_viewer):
    event(
        "profile.update",
        repr="mig-7",
        before={"description": "", "replicas": 1, "mode": "mig"},
        after={"description": "inference", "replicas": 1, "mode": "mig"},
    )
    event(
        "rollout.pause",
        who="operator",
        object_type="rollout",
        object_id="4",
        before={"status": "running"},
        after={"status": "paused"},
    )
    event(
        "change.failed",
        who="tessera-worker",
        kind="system",
        object_type="nodechange",
        object_id="9",
        message="MIG Manager reported failed",
    )
    html = client_viewer.get(reverse("audit_log")).content.decode()
    assert actions(html) == ["change.failed", "rollout.pause", "profile.update"]  # newest first
    assert 'href="/profiles/1/">mig-7</a>' in html and 'href="/rollouts/4/">' in html
    assert '<span class="diff__key">description</span><del class="diff__before">&quot;&quot;</del>' in html
    assert '<ins class="diff__after">&quot;inference&quot;</ins>' in html
    assert "replicas" not in html  # unchanged keys are left out
    assert "Tessera" in html and "MIG Manager reported failed" in html


def test_audit_log_filters_in_place(client_viewer):
    event("profile.create", who="admin", ago=120)
    event("rollout.create", who="operator", object_type="rollout", ago=30)
    event("rollout.cancel", who="operator", object_type="rollout", ago=5)
    event("schedule.update", who="ops-lead", object_type="schedule", ago=1)

    def rows(**params):
        html = client_viewer.get(reverse("audit_log"), params, **HTMX).content.decode()
        assert html.lstrip().startswith('<div id="audit-table"') and "<form" not in html
        return actions(html)

    assert rows(action="rollout.") == ["rollout.cancel", "rollout.create"]
    assert rows(actor="ops") == ["schedule.update"]
    assert rows(object_type="sharingprofile") == ["profile.create"]
    since = (timezone.now() - timedelta(minutes=60)).strftime("%Y-%m-%dT%H:%M")
    until = (timezone.now() - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M")
    assert rows(since=since, until=until) == ["rollout.create"]
    html = client_viewer.get(reverse("audit_log"), {"action": "nothing."}, **HTMX).content.decode()
    assert "No events match these filters" in html


def test_audit_log_speaks_of_object_types_in_words(client_viewer):
    event("qos.update", object_type="qospolicy", object_id="4")
    html = client_viewer.get(reverse("audit_log")).content.decode()
    select = re.search(r'<select id="audit-type".*?</select>', html, re.S).group(0)
    assert '<option value="sharingprofile">Sharing profile</option>' in select
    assert (
        '<option value="nodepool">Node pool</option>' in select
        and '<option value="qospolicy">QoS policy</option>' in select
    )
    assert ">sharingprofile<" not in select and ">nodepool<" not in select
    assert '<span class="sub">QoS policy #4</span>' in html
    # A filter's error names the filter, not its parameter.
    html = client_viewer.get(reverse("audit_log"), {"since": "yesterday"}, **HTMX).content.decode()
    assert "Since: Enter a valid date/time." in html


def test_audit_log_filter_form_works_without_javascript(client_viewer):
    html = client_viewer.get(reverse("audit_log")).content.decode()
    form = re.search(r'<form class="filters" method="get" action="/audit/"[^>]*>', html).group(0)
    assert 'hx-get="/audit/"' in form and 'hx-trigger="change, submit"' in form
    for control in ("audit-actor", "audit-action", "audit-type", "audit-since", "audit-until"):
        assert f'<label for="{control}">' in html
    assert 'hx-target="#audit-table"' in html and 'hx-push-url="true"' in html


def test_audit_log_paginates(client_viewer):
    for i in range(55):
        event("profile.update", object_id=str(i))
    html = client_viewer.get(reverse("audit_log")).content.decode()
    assert len(actions(html)) == 50 and "Showing 1–50 of 55 events" in html
    html = client_viewer.get(reverse("audit_log"), {"page": 2}, **HTMX).content.decode()
    assert len(actions(html)) == 5


@pytest.mark.parametrize("count", [3, 60])
def test_audit_log_query_count_is_bounded(client_viewer, django_assert_max_num_queries, count):
    for i in range(count):
        event("profile.update", object_id=str(i), before={"a": i}, after={"a": i + 1})
    # session, user, role; count and page
    with django_assert_max_num_queries(6):
        assert client_viewer.get(reverse("audit_log")).status_code == 200


def test_audit_diff_rows():
    assert audit_diff({"status": "running"}, {"status": "paused"}) == [
        {"key": "status", "before": '"running"', "after": '"paused"'}
    ]
    assert audit_diff(None, {"profile": "mig-7"}) == [{"key": "profile", "before": None, "after": '"mig-7"'}]
    assert audit_diff("a", "b") == [{"key": "", "before": '"a"', "after": '"b"'}]
    many = audit_diff(None, {f"k{i}": i for i in range(9)})
    assert len(many) == 7 and many[-1]["more"] == 3
    assert audit_diff({"a": 1, "b": 2}, {"a": 1}) == [{"key": "b", "before": "2", "after": None}]
    assert audit_diff(None, None) == []
