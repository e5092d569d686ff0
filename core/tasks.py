"""Celery tasks of the core app: thin, idempotent."""

from celery import shared_task

from core.periodic import OncePerPeriod
from core.retention import PRUNE_SOFT_TIME_LIMIT, PRUNE_TIME_LIMIT, core_prune


@shared_task(base=OncePerPeriod, soft_time_limit=PRUNE_SOFT_TIME_LIMIT, time_limit=PRUNE_TIME_LIMIT)
def retention_prune() -> dict:
    """Beat's daily prune of core's state: expired sessions, old task results; then the SQLite WAL is truncated."""
    return core_prune()
