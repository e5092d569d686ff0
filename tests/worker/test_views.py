"""Rollout pages: the filterable list with progress, the live rollout page (progress bar, node dots, nodes,
events, polling only while running or paused), pause / resume / cancel for operators, and node change history."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from core.models import AuditEvent
from fleet.models import Node
from tests.factories import ClusterFactory, NodeFactory, NodePoolFactory
from tests.worker.test_engine import _fail_canary
from worker import reconcile, services
from worker.models import NodeChange, NodeRetry, Rollout

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def login(client, user):
    client.force_login(user)
    return client


def make_rollout(statuses, *, status="running", title="inference → mig-7", trigger="user", **kwargs) -> Rollout:
    """A rollout whose node changes are in the given statuses (in rollout order)."""
    pool = NodePoolFactory(cluster=ClusterFactory(driver="agent", kubeconfig_path=""))
    rollout = Rollout.objects.create(
        title=title, trigger=trigger, actor_label="operator", pool=pool, status=status, **kwargs
    )
    for position, change_status in enumerate(statuses):
        node = NodeFactory(cluster=pool.cluster, pool=pool, name=f"{pool.name}-n{position:02d}")
        NodeChange.objects.create(
            rollout=rollout,
            node=node,
            position=position,
            status=change_status,
            to_config={"profile": "mig-7", "mig_config": "tessera-mig-abc"},
            applied_mig_config="tessera-mig-abc",
            error="MIG Manager reported failed: GPU 1 in use" if change_status == "failed" else "",
            attempts=1 if change_status != "queued" else 0,
        )
    return rollout


def dots(html: str) -> list[str]:
    return re.findall(r'<li class="dot dot--(\w+)', html)


# --- access ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["worker:rollout_list", "worker:rollout_detail", "worker:rollout_live"])
def test_pages_need_login(client, name):
    args = [] if name == "worker:rollout_list" else [1]
    response = client.get(reverse(name, args=args))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
def test_steering_is_refused_to_viewers(client, viewer, action):
    rollout = make_rollout(["queued"], status="paused" if action == "resume" else "running")
    before = rollout.status
    response = login(client, viewer).post(reverse(f"worker:rollout_{action}", args=[rollout.pk]))
    assert response.status_code == 403
    rollout.refresh_from_db()
    assert rollout.status == before


def test_buttons_only_for_operators(client, viewer, operator):
    rollout = make_rollout(["queued", "applying"])
    html = login(client, viewer).get(rollout.get_absolute_url()).content.decode()
    assert "Pause" not in html and "Cancel rollout" not in html
    html = login(client, operator).get(rollout.get_absolute_url()).content.decode()
    assert f'action="/rollouts/{rollout.pk}/pause/"' in html and f'action="/rollouts/{rollout.pk}/cancel/"' in html


# --- list ------------------------------------------------------------------------------------------------------


def test_list_shows_status_progress_trigger_and_who(client, viewer):
    running = make_rollout(["succeeded", "succeeded", "applying", "queued"], title="a → mig-7")
    make_rollout(["succeeded"], status="succeeded", title="b → whole", trigger="schedule")
    html = login(client, viewer).get(reverse("worker:rollout_list")).content.decode()
    assert f'href="/rollouts/{running.pk}/"' in html and "#" + str(running.pk) in html
    assert 'badge--pending">Running' in html and 'badge--success">Succeeded' in html
    assert '2/4<span class="unit"> nodes · 50 %</span>' in html
    assert 'progress__seg--succeeded" style="width: 50.00%"' in html
    assert "Schedule" in html and "operator" in html


def test_a_cancelled_rollout_shows_how_far_it_got_not_100_percent(client, viewer):
    rollout = make_rollout(["succeeded", "cancelled", "cancelled", "cancelled"], status="cancelled")
    html = login(client, viewer).get(reverse("worker:rollout_list")).content.decode()
    assert '1/4<span class="unit"> nodes · 25 % · 3 cancelled</span>' in html
    assert "100 %" not in html
    # The bar draws what ran; the cancelled nodes leave their part of it empty.
    assert 'progress__seg--succeeded" style="width: 25.00%"' in html and "progress__seg--skipped" not in html
    detail = client.get(rollout.get_absolute_url()).content.decode()
    assert "1 of 4 nodes done, 1 succeeded" in detail


def test_a_node_waiting_for_idle_shows_until_when(client, viewer):
    rollout = make_rollout(["waiting_for_idle"], busy_policy="wait", wait_minutes=30)
    change = rollout.changes.get()
    change.deadline = timezone.now() + timedelta(minutes=30)
    change.save()
    until = timezone.localtime(change.deadline).strftime("%H:%M")
    html = login(client, viewer).get(rollout.get_absolute_url()).content.decode()
    assert f"Waiting for idle · until {until}</span>" in html
    node_page = client.get(reverse("console:node_detail", args=[change.node_id])).content.decode()
    assert f"Waiting for idle · until {until}</span>" in node_page


def test_api_progress_counts_cancelled_nodes_apart(api_client, viewer):
    rollout = make_rollout(["succeeded", "skipped", "cancelled", "cancelled"], status="cancelled")
    api_client.force_authenticate(viewer)
    progress = api_client.get(f"/api/v1/rollouts/{rollout.pk}/").json()["progress"]
    assert {k: progress[k] for k in ("total", "finished", "done", "cancelled", "percent")} == {
        "total": 4,
        "finished": 4,
        "done": 2,
        "cancelled": 2,
        "percent": 50,
    }


def test_list_filters_in_place(client, viewer):
    make_rollout(["queued"], title="active one")
    make_rollout(["succeeded"], status="succeeded", title="done one")
    make_rollout(["failed"], status="failed", title="broken one", trigger="reconcile")
    login(client, viewer)

    def titles(**params):
        html = client.get(reverse("worker:rollout_list"), params, **HTMX).content.decode()
        assert html.lstrip().startswith('<div id="rollout-table"')
        return sorted(re.findall(r"#\d+ (\w+ one)</a>", html))

    assert titles(active="true") == ["active one"]
    assert titles(active="false") == ["broken one", "done one"]
    assert titles(status=["failed", "succeeded"]) == ["broken one", "done one"]
    assert titles(trigger="reconcile") == ["broken one"]
    html = client.get(reverse("worker:rollout_list"), {"status": "paused"}, **HTMX).content.decode()
    assert "No rollouts match these filters" in html


@pytest.mark.parametrize("count", [2, 30])
def test_list_query_count_is_bounded(client, viewer, django_assert_max_num_queries, count):
    for _ in range(count):
        make_rollout(["succeeded", "applying", "queued"])
    login(client, viewer)
    # session, user, role; count and page (progress annotated in the same query)
    with django_assert_max_num_queries(6):
        assert client.get(reverse("worker:rollout_list")).status_code == 200


# --- the rollout page ------------------------------------------------------------------------------------------


def test_rollout_page_shows_progress_dots_nodes_and_events(client, viewer):
    rollout = make_rollout(["succeeded", "failed", "applying", "queued", "queued"], canary_count=1)
    first, failed = rollout.changes.order_by("position")[:2]
    AuditEvent.objects.create(
        at=timezone.now(),
        actor_kind="system",
        actor_label="tessera-worker",
        action="change.failed",
        object_type="nodechange",
        object_id=str(failed.pk),
        object_repr=f"{failed.node.name} (rollout #{rollout.pk})",
        before={"status": "verifying"},
        after={"status": "failed"},
        message="MIG Manager reported failed",
    )
    AuditEvent.objects.create(
        at=timezone.now(),
        actor_kind="user",
        actor_label="operator",
        action="rollout.create",
        object_type="rollout",
        object_id=str(rollout.pk),
        object_repr=str(rollout),
    )
    other = make_rollout(["queued"])
    AuditEvent.objects.create(
        at=timezone.now(),
        actor_kind="system",
        actor_label="x",
        action="change.other",
        object_type="nodechange",
        object_id=str(other.changes.get().pk),
        object_repr="elsewhere",
    )
    html = login(client, viewer).get(rollout.get_absolute_url()).content.decode()
    assert dots(html) == ["succeeded", "failed", "applying", "queued", "queued"]
    assert "dot--canary" in html
    assert "Succeeded <strong>1</strong>" in html and "Queued <strong>2</strong>" in html
    assert '2/5<span class="unit"> nodes · 40 %</span>' in html
    assert f'href="/nodes/{first.node_id}/"' in html and "GPU 1 in use" in html and "tessera-mig-abc" in html
    assert "change.failed" in html and "verifying → failed" in html and "rollout.create" in html
    assert "change.other" not in html
    assert f'hx-get="/rollouts/{rollout.pk}/live/" hx-trigger="every 2s"' in html


def test_live_partial_polls_while_running_and_stops_when_finished(client, viewer):
    rollout = make_rollout(["applying", "queued"])
    login(client, viewer)
    html = client.get(reverse("worker:rollout_live", args=[rollout.pk]), **HTMX).content.decode()
    assert html.lstrip().startswith('<div id="rollout-live"') and 'hx-trigger="every 2s"' in html
    assert "<html" not in html
    NodeChange.objects.filter(rollout=rollout).update(status="succeeded")
    Rollout.objects.filter(pk=rollout.pk).update(status="succeeded", finished_at=timezone.now())
    html = client.get(reverse("worker:rollout_live", args=[rollout.pk]), **HTMX).content.decode()
    assert "hx-trigger" not in html and "2/2" in html and "finished" in html


def test_rollout_page_query_count(client, viewer, django_assert_max_num_queries):
    rollout = make_rollout(["succeeded"] * 20 + ["queued"] * 20)
    login(client, viewer)
    # session, user, role; rollout with progress; its changes with nodes; the nodes waiting for a retry; events
    with django_assert_max_num_queries(7):
        assert client.get(rollout.get_absolute_url()).status_code == 200


def test_missing_rollout_is_404(client, viewer):
    assert login(client, viewer).get(reverse("worker:rollout_detail", args=[999])).status_code == 404


# --- pause / resume / cancel -----------------------------------------------------------------------------------


def test_pause_resume_cancel_plain_forms(client, operator):
    rollout = make_rollout(["applying", "queued", "waiting_for_idle"])
    login(client, operator)
    response = client.post(reverse("worker:rollout_pause", args=[rollout.pk]))
    assert response.status_code == 302 and response["Location"] == rollout.get_absolute_url()
    rollout.refresh_from_db()
    assert rollout.status == "paused"
    client.post(reverse("worker:rollout_resume", args=[rollout.pk]))
    rollout.refresh_from_db()
    assert rollout.status == "running"
    client.post(reverse("worker:rollout_cancel", args=[rollout.pk]))
    rollout.refresh_from_db()
    assert rollout.status == "cancelled"
    assert sorted(rollout.changes.values_list("status", flat=True)) == ["applying", "cancelled", "cancelled"]
    assert AuditEvent.objects.filter(action="rollout.pause", actor_label="operator").exists()


def test_pause_over_htmx_answers_with_the_live_section(client, operator):
    rollout = make_rollout(["applying", "queued"])
    login(client, operator)
    html = client.post(reverse("worker:rollout_pause", args=[rollout.pk]), **HTMX).content.decode()
    assert html.lstrip().startswith('<div id="rollout-live"')
    assert 'badge--warning">Paused' in html and f"Rollout #{rollout.pk} paused." in html
    assert f'action="/rollouts/{rollout.pk}/resume/"' in html


def test_cancelling_a_finished_rollout_says_why(client, operator):
    rollout = make_rollout(["succeeded"], status="succeeded")
    login(client, operator)
    response = client.post(reverse("worker:rollout_cancel", args=[rollout.pk]), follow=True)
    assert b"it cannot be cancel" in response.content
    html = client.post(reverse("worker:rollout_cancel", args=[rollout.pk]), **HTMX).content.decode()
    assert "is succeeded" in html and "hx-trigger" not in html


# --- node change history on the node page ------------------------------------------------------------------------


def test_node_page_lists_its_changes_newest_first(client, viewer):
    old = make_rollout(["failed"], status="failed", title="first try")
    node = old.changes.get().node
    new = Rollout.objects.create(title="second try", trigger="user", actor_label="operator", status="running")
    NodeChange.objects.create(rollout=new, node=node, position=0, status="applying", to_config={"profile": "mig-7"})
    html = login(client, viewer).get(node.get_absolute_url()).content.decode()
    section = html[html.index("history-heading") :]
    assert section.index(f"#{new.pk}") < section.index(f"#{old.pk}")
    assert f'href="/rollouts/{old.pk}/#change-' in section
    assert 'badge--failed">Failed' in section and "GPU 1 in use" in section and 'badge--pending">Applying' in section


# --- failures, back-off and supersede on the pages ---------------------------------------------------------------


@pytest.fixture
def failed_canary(fleet):
    """Issue 17's rollout: an agent pool of 5 nodes whose canary failed; the rollout failed, the rest held."""
    cluster, _, _ = fleet
    (rollout_id,) = reconcile.reconcile()
    canary = _fail_canary(cluster, rollout_id)
    services.rollout_advance(rollout_id)
    return Rollout.objects.get(pk=rollout_id), canary


def test_node_page_shows_the_next_try_and_operators_retry_now(client, viewer, operator, failed_canary):
    rollout, canary = failed_canary
    retry = NodeRetry.objects.get(node=canary.node)
    page = reverse("console:node_detail", args=[canary.node_id])
    html = login(client, viewer).get(page).content.decode()
    assert f'Last change failed · next try <time datetime="{retry.next_retry_at.isoformat()}"' in html
    assert "MIG Manager reported failed" in html and "Retry now" not in html  # viewers see, operators act
    url = reverse("console:node_retry_now", args=[canary.node_id])
    assert client.post(url).status_code == 403
    html = login(client, operator).get(page).content.decode()
    assert f'action="{url}"' in html and "Retry now" in html
    assert client.get(url).status_code == 405
    response = client.post(url, follow=True)
    assert "retrying now" in response.content.decode()
    assert AuditEvent.objects.filter(action="node.retry_now", object_id=str(canary.node_id)).count() == 1
    held = Node.objects.exclude(pk=canary.node_id).first()
    assert "Held back with" in client.get(reverse("console:node_detail", args=[held.pk])).content.decode()


def test_rollout_page_shows_failed_retries_and_superseded(client, operator, failed_canary):
    rollout, canary = failed_canary
    html = login(client, operator).get(rollout.get_absolute_url()).content.decode()
    assert '<span class="badge badge--failed">Failed</span>' in html
    assert "5 nodes wait for a retry" in html and html.count("next try") == 6  # the callout and each node
    response = client.post(reverse("worker:rollout_retry_now", args=[rollout.pk]), **HTMX)
    assert "retried now" in response.content.decode() and "wait for a retry" not in response.content.decode()
    old = make_rollout(["cancelled"], status="superseded", superseded_by=rollout)
    html = client.get(old.get_absolute_url()).content.decode()
    assert '<span class="badge badge--stale">Superseded</span>' in html
    assert f'superseded by <a href="{rollout.get_absolute_url()}">rollout #{rollout.pk}</a>' in html
    listed = client.get(reverse("worker:rollout_list") + "?status=superseded").content.decode()
    assert old.title in listed and 'value="superseded"' in listed
