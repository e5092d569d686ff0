"""Bounded state: the building blocks every app's daily prune uses, and core's own prune (sessions, task results,
the SQLite WAL). What each app keeps, and for how long, is in docs/operations.md#bounded-state."""

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import connection, models, transaction
from django.utils import timezone
from django_celery_results.models import GroupResult, TaskResult

from core.models import PeriodicRun

# Time limits of every app's prune task: a first prune of a long backlog may take minutes; each batch commits, so a
# run cut short keeps what it did and the next day's run goes on.
PRUNE_SOFT_TIME_LIMIT = 1800
PRUNE_TIME_LIMIT = PRUNE_SOFT_TIME_LIMIT + 60


def retention(key: str):
    """One value of TESSERA["RETENTION"] (config/settings/base.py)."""
    return settings.TESSERA["RETENTION"][key]


def cutoff(days_key: str, now: datetime) -> datetime:
    """The instant before which rows of this retention setting (a number of days) go."""
    return now - timedelta(days=retention(days_key))


def unreferenced(queryset: models.QuerySet) -> models.QuerySet:
    """The rows of `queryset` that no PROTECT or RESTRICT foreign key points at: what deleting may remove without
    failing, whichever app (above this one) holds the reference."""
    model = queryset.model
    for relation in model._meta.related_objects:
        if relation.on_delete in (models.PROTECT, models.RESTRICT):
            column = relation.field.attname  # NULLs left out: NOT IN over a NULL would keep every row
            referencing = relation.related_model._base_manager.filter(**{f"{column}__isnull": False}).values(column)
            queryset = queryset.exclude(**{f"{relation.field.target_field.attname}__in": referencing})
    return queryset


def delete_in_batches(queryset: models.QuerySet, *, batch_size: int | None = None) -> int:
    """Delete the rows of `queryset` (and what cascades from them) one batch per transaction; returns the rows of
    `queryset` deleted. A first prune of a long backlog so never holds the database's write lock for long."""
    batch_size = batch_size or retention("BATCH_SIZE")
    pks = queryset.order_by("pk").values_list("pk", flat=True)
    total = 0
    while True:
        with transaction.atomic():
            batch = list(pks[:batch_size])
            if not batch:
                return total
            queryset.model._base_manager.filter(pk__in=batch).delete()
        total += len(batch)


def sqlite_checkpoint() -> tuple[int, int, int] | None:
    """On SQLite, copy the WAL into the database and truncate it to zero bytes; returns (busy, log pages,
    checkpointed pages), busy=1 when a reader kept the checkpoint from finishing (the next one catches up). None on
    other databases, and inside a transaction, where SQLite cannot checkpoint."""
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return None
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return tuple(cursor.fetchone())


def sqlite_analyze() -> None:
    """On SQLite, refresh the query planner's statistics: without them it never picks a covering index over the
    primary key (the overview's GPU charts read nodes through one, bench B5). Tens of milliseconds at 80,000 GPUs."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def core_prune(*, now: datetime | None = None) -> dict:
    """Delete expired sessions, Celery task results older than TASK_RESULTS_DAYS and beat's periodic-run claims older
    than PERIODIC_RUNS_DAYS, then refresh SQLite's planner statistics and checkpoint its WAL. Runs after the other
    apps' prunes, so the checkpoint also takes in their deletions."""
    now = now or timezone.now()
    results_before = cutoff("TASK_RESULTS_DAYS", now)
    pruned = {
        "sessions": delete_in_batches(Session.objects.filter(expire_date__lt=now)),
        "task_results": delete_in_batches(TaskResult.objects.filter(date_done__lt=results_before)),
        "group_results": delete_in_batches(GroupResult.objects.filter(date_done__lt=results_before)),
        "periodic_runs": delete_in_batches(
            PeriodicRun.objects.filter(period_start__lt=cutoff("PERIODIC_RUNS_DAYS", now))
        ),
    }
    sqlite_analyze()  # first: its statistics are written to the WAL the checkpoint then empties
    checkpoint = sqlite_checkpoint()
    if checkpoint is not None:
        pruned["wal_checkpoint_busy"] = checkpoint[0]
    return pruned
