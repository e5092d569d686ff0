"""Rollout history kept for a while, then pruned (settings: TESSERA["RETENTION"]); the audit log keeps every
rollout's creation and end for good."""

from datetime import datetime

from django.db.models import Max, Q
from django.utils import timezone

from core.retention import cutoff, delete_in_batches, retention
from worker.choices import FINISHED_ROLLOUT_STATUSES, ChangeStatus
from worker.models import NodeChange, Rollout


def _rollouts_still_read():
    """Rollouts holding a live node's latest change or its latest successful one: the agents' desired config and the
    node page's change history read those, whatever their age."""
    live = NodeChange.objects.filter(node__gone_at__isnull=True).order_by().values("node_id")
    latest = live.annotate(last=Max("pk")).values("last")
    latest_succeeded = live.filter(status=ChangeStatus.SUCCEEDED).annotate(last=Max("pk")).values("last")
    return NodeChange.objects.filter(Q(pk__in=latest) | Q(pk__in=latest_succeeded)).values("rollout_id")


def worker_prune(*, now: datetime | None = None) -> dict:
    """Delete rollouts finished more than ROLLOUTS_DAYS ago, with their node changes; returns the rows deleted by
    kind. Running and paused rollouts stay whatever their age, and so do those still read (`_rollouts_still_read`).

    The rollouts are chosen once; their node changes go first, in batches of their own, so a rollout of thousands of
    nodes is no single long delete either.
    """
    now = now or timezone.now()
    old = list(
        Rollout.objects.filter(status__in=FINISHED_ROLLOUT_STATUSES, finished_at__lt=cutoff("ROLLOUTS_DAYS", now))
        .exclude(pk__in=_rollouts_still_read())
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    pruned = {"node_changes": 0, "rollouts": 0}
    size = retention("BATCH_SIZE")
    for i in range(0, len(old), size):
        chunk = old[i : i + size]
        pruned["node_changes"] += delete_in_batches(NodeChange.objects.filter(rollout_id__in=chunk))
        pruned["rollouts"] += delete_in_batches(Rollout.objects.filter(pk__in=chunk))
    return pruned
