"""Celery tasks of the fleet app: thin, idempotent, taking ids."""

from celery import shared_task

from core.periodic import OncePerPeriod
from core.retention import PRUNE_SOFT_TIME_LIMIT, PRUNE_TIME_LIMIT
from fleet import services
from fleet.models import NodePool
from fleet.retention import fleet_prune


@shared_task(soft_time_limit=60, time_limit=90)
def pool_apply_selector(pool_id: int) -> int:
    """Re-evaluate a selector pool's members; a no-op for a deleted pool or one without a selector."""
    pool = NodePool.objects.filter(pk=pool_id).select_related("cluster").first()
    if pool is None or not pool.node_selector:
        return 0
    return services.pool_apply_selector(pool=pool)


@shared_task(base=OncePerPeriod, soft_time_limit=PRUNE_SOFT_TIME_LIMIT, time_limit=PRUNE_TIME_LIMIT)
def retention_prune() -> dict:
    """Beat's daily prune of the fleet's history: old GPU events, long-gone nodes and GPUs, revoked credentials."""
    return fleet_prune()
