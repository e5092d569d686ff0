"""The fleet's history kept for a while, then pruned: GPU events, nodes and GPUs gone from their cluster, pods of
gone nodes, replaced agent credentials (settings: TESSERA["RETENTION"]), expired agent registration requests."""

from datetime import datetime

from django.db.models import Count, Q
from django.utils import timezone

from core.retention import cutoff, delete_in_batches, retention, unreferenced
from fleet.models import AgentCredential, Gpu, GpuEvent, Node, PendingAgent, Pod


def _gpu_events_over_cap(cap: int) -> int:
    """Delete all but the `cap` newest events of each GPU that has more (an XID storm, a flapping ECC counter);
    0 keeps them all."""
    if cap <= 0:
        return 0
    deleted = 0
    crowded = GpuEvent.objects.values("gpu_id").annotate(n=Count("pk")).filter(n__gt=cap).values_list("gpu_id")
    for (gpu_id,) in list(crowded):  # read before deleting from the same table
        events = GpuEvent.objects.filter(gpu_id=gpu_id)
        at, pk = events.order_by("-at", "-pk").values_list("at", "pk")[cap - 1]
        deleted += delete_in_batches(events.filter(Q(at__lt=at) | Q(at=at, pk__lt=pk)))
    return deleted


def fleet_prune(*, now: datetime | None = None) -> dict:
    """Delete what the fleet's retention settings let go; returns the rows deleted by kind.

    A gone node goes GONE_DAYS after it went, with its GPUs, pods, credentials and pin, unless a row of another app
    still protects it (a rollout kept for its history names it): it goes in the first prune after that one does.
    """
    now = now or timezone.now()
    gone_before = cutoff("GONE_DAYS", now)
    return {
        "gpu_events": delete_in_batches(GpuEvent.objects.filter(at__lt=cutoff("GPU_EVENTS_DAYS", now))),
        "gpu_events_over_cap": _gpu_events_over_cap(retention("GPU_EVENTS_PER_GPU")),
        # Nothing observes the pods of a node that left its cluster any more: what is stored of them is stale.
        "pods_of_gone_nodes": delete_in_batches(Pod.objects.filter(node__gone_at__isnull=False)),
        "nodes": delete_in_batches(unreferenced(Node.objects.filter(gone_at__lt=gone_before))),
        "gpus": delete_in_batches(unreferenced(Gpu.objects.filter(gone_at__lt=gone_before))),
        "revoked_credentials": delete_in_batches(
            AgentCredential.objects.filter(revoked_at__lt=cutoff("REVOKED_CREDENTIALS_DAYS", now))
        ),
        # Registration requests no admin decided in time (TESSERA["PENDING_AGENT_TTL_HOURS"]): never approvable.
        "expired_pending_agents": delete_in_batches(PendingAgent.objects.expired(now)),
    }
