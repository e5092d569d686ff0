"""Celery tasks of the capacity app: thin and idempotent (a bucket sampled twice is replaced, not doubled)."""

from celery import shared_task

from capacity.retention import capacity_prune
from capacity.sampling import sample_record
from core.periodic import OncePerPeriod
from core.retention import PRUNE_SOFT_TIME_LIMIT, PRUNE_TIME_LIMIT


@shared_task(base=OncePerPeriod, soft_time_limit=120, time_limit=150)
def sample() -> int:
    """Beat's sample of every pool's demand, usage and utilisation into the current bucket."""
    return sample_record()


@shared_task(base=OncePerPeriod, soft_time_limit=PRUNE_SOFT_TIME_LIMIT, time_limit=PRUNE_TIME_LIMIT)
def retention_prune() -> dict:
    """Beat's daily prune of demand and usage samples past RETENTION["DEMAND_DAYS"]."""
    return capacity_prune()
