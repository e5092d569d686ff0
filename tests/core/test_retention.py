"""Bounded state, core's part: batched deletion, rows other apps protect, expired sessions, task results, the SQLite
WAL, and the beat schedule that runs every app's prune."""

import os
from datetime import timedelta

import pytest
from celery.schedules import crontab
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_celery_results.models import TaskResult

from core import retention
from core.tasks import retention_prune
from fleet.models import Node
from tests.factories import NodeFactory
from worker.models import NodeChange, Rollout

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def test_delete_in_batches_deletes_one_batch_per_transaction():
    nodes = NodeFactory.create_batch(7)
    keep = NodeFactory()
    with CaptureQueriesContext(connection) as queries:
        deleted = retention.delete_in_batches(Node.objects.exclude(pk=keep.pk), batch_size=3)
    assert deleted == len(nodes) == 7
    assert list(Node.objects.all()) == [keep]
    # 3 + 3 + 1 rows, then an empty batch ends it: four transactions, each its own savepoint in the test's.
    assert sum("SAVEPOINT" in q["sql"] and "RELEASE" not in q["sql"] for q in queries.captured_queries) == 4


def test_unreferenced_leaves_out_rows_a_protect_foreign_key_points_at():
    """fleet cannot name worker's NodeChange; the PROTECT relation tells it which nodes a rollout still names."""
    named, free = NodeFactory(), NodeFactory()
    rollout = Rollout.objects.create(title="t", trigger="user", actor_label="t", status="succeeded")
    NodeChange.objects.create(rollout=rollout, node=named, position=0, status="succeeded")
    assert list(retention.unreferenced(Node.objects.all())) == [free]


def test_core_prune_deletes_expired_sessions_and_old_task_results_and_keeps_the_rest():
    for key, expires in (("gone", NOW - timedelta(seconds=1)), ("live", NOW + timedelta(days=1))):
        Session.objects.create(session_key=key, session_data="x", expire_date=expires)
    old = TaskResult.objects.create(task_id="old", status="SUCCESS")
    TaskResult.objects.filter(pk=old.pk).update(date_done=NOW - timedelta(days=1, seconds=1))
    TaskResult.objects.create(task_id="new", status="SUCCESS")

    pruned = retention.core_prune(now=NOW)

    assert pruned["sessions"] == 1 and pruned["task_results"] == 1
    assert list(Session.objects.values_list("session_key", flat=True)) == ["live"]
    assert list(TaskResult.objects.values_list("task_id", flat=True)) == ["new"]


@pytest.mark.django_db(transaction=True)
def test_the_prune_task_truncates_the_sqlite_wal():
    if connection.vendor != "sqlite":
        pytest.skip("the WAL is SQLite's")
    with connection.cursor() as cursor:
        assert cursor.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    NodeFactory.create_batch(20)
    wal = f"{connection.settings_dict['NAME']}-wal"
    assert os.path.getsize(wal) > 0

    result = retention_prune.delay().get()

    assert result["wal_checkpoint_busy"] == 0
    assert os.path.getsize(wal) == 0


def test_task_results_are_not_stored():
    """No code reads a result; storing one was a database write per task."""
    assert settings.CELERY_TASK_IGNORE_RESULT is True
    assert settings.CELERY_RESULT_EXPIRES is None  # so Celery schedules no unbatched cleanup of its own


def test_beat_runs_each_apps_prune_daily_rollouts_before_nodes_and_core_last():
    entries = {e["task"]: e["schedule"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    prunes = ["worker.tasks.retention_prune", "fleet.tasks.retention_prune", "core.tasks.retention_prune"]
    for task in prunes:
        assert isinstance(entries[task], crontab) and entries[task].hour == {settings.PRUNE_HOUR}
    minutes = [min(entries[task].minute) for task in prunes]
    assert minutes == sorted(minutes)


def test_core_prune_refreshes_sqlite_planner_statistics():
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's autovacuum keeps its statistics")
    NodeFactory.create_batch(3)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS sqlite_stat1")  # as a database nobody analysed

    retention.core_prune(now=NOW)

    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM sqlite_stat1 WHERE tbl = 'fleet_node'")
        assert cursor.fetchone()[0] > 0
