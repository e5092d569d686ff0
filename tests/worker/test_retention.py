"""Bounded state, the worker's part: finished rollouts go after ROLLOUTS_DAYS with their node changes; running and
paused ones stay, and so does any rollout holding a live node's latest change or its latest successful one."""

from datetime import timedelta

import pytest
from django.utils import timezone

from core.models import AuditEvent
from tests.factories import NodeFactory
from worker.models import NodeChange, Rollout
from worker.retention import worker_prune
from worker.tasks import retention_prune

pytestmark = pytest.mark.django_db
NOW = timezone.now()
DAY = timedelta(days=1)


def _rollout(status: str, finished_days_ago: int | None, *changes: tuple) -> Rollout:
    """A rollout with one change per (node, status)."""
    finished = NOW - finished_days_ago * DAY if finished_days_ago is not None else None
    rollout = Rollout.objects.create(title="t", trigger="user", actor_label="t", status=status, finished_at=finished)
    for position, (node, change_status) in enumerate(changes):
        NodeChange.objects.create(rollout=rollout, node=node, position=position, status=change_status)
    return rollout


def test_finished_rollouts_older_than_the_setting_go_with_their_changes():
    a, b = NodeFactory(), NodeFactory()
    old = [_rollout(s, 181, (a, "succeeded"), (b, "failed")) for s in ("succeeded", "failed", "cancelled")]
    recent = _rollout("succeeded", 179, (a, "succeeded"), (b, "succeeded"))
    # The newest changes of both nodes sit in `recent`: nothing else holds the old ones.

    pruned = worker_prune(now=NOW)

    assert pruned == {"rollouts": 3, "node_changes": 6}
    assert list(Rollout.objects.all()) == [recent]
    assert not NodeChange.objects.filter(rollout__in=old).exists()


def test_running_and_paused_rollouts_stay_whatever_their_age():
    node = NodeFactory()
    running = _rollout("running", None, (node, "verifying"))
    Rollout.objects.filter(pk=running.pk).update(created_at=NOW - 400 * DAY)
    paused = _rollout("paused", None, (NodeFactory(), "queued"))
    assert worker_prune(now=NOW) == {"rollouts": 0, "node_changes": 0}
    assert set(Rollout.objects.all()) == {running, paused}


def test_a_rollout_holding_a_live_nodes_current_config_or_latest_failure_stays():
    """Agents read the change that brought their node its config; the loop reads a node's latest failure (it waits
    for a human instead of retrying): both stay however old. A gone node's changes hold nothing."""
    ok, failing, gone = NodeFactory(), NodeFactory(), NodeFactory(gone_at=NOW - 300 * DAY)
    applied = _rollout("succeeded", 300, (ok, "succeeded"), (failing, "succeeded"), (gone, "succeeded"))
    _rollout("failed", 250, (failing, "failed"))
    last_success = _rollout("succeeded", 200, (failing, "succeeded"))
    latest_failure = _rollout("failed", 190, (failing, "rolled_back"))

    worker_prune(now=NOW)

    assert set(Rollout.objects.all()) == {applied, last_success, latest_failure}


def test_the_task_prunes_and_the_audit_log_is_kept():
    rollout = _rollout("succeeded", 365, (NodeFactory(gone_at=NOW - 365 * DAY), "succeeded"))
    AuditEvent.objects.create(
        at=NOW - 365 * DAY, actor_kind="system", actor_label="t", action="rollout.create", object_type="rollout",
        object_id=str(rollout.pk), object_repr=str(rollout),
    )  # fmt: skip
    assert retention_prune.delay().get() == {"rollouts": 1, "node_changes": 1}
    assert AuditEvent.objects.filter(object_id=str(rollout.pk)).exists()
