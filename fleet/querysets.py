"""Reusable reads of the fleet, chainable: Gpu.objects.live().mig_capable().in_pool(pool)."""

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet.choices import ClusterDriver


def stale_cutoff(now=None):
    """Observations older than this instant make a node stale."""
    return (now or timezone.now()) - timedelta(seconds=settings.TESSERA["STALE_AFTER_SECONDS"])


def agent_stale_cutoff(now=None):
    """A node of an agent cluster is stale once its agent missed three reports."""
    return (now or timezone.now()) - timedelta(seconds=3 * settings.TESSERA.get("AGENT_INTERVAL_SECONDS", 15))


def pending_agent_ttl() -> timedelta:
    """How long a registration request waits for an admin: then it expires, can no longer be approved, and the
    fleet's prune deletes it (TESSERA["PENDING_AGENT_TTL_HOURS"])."""
    return timedelta(hours=settings.TESSERA["PENDING_AGENT_TTL_HOURS"])


def pending_agent_cutoff(now=None):
    """Requests waiting since before this instant have expired."""
    return (now or timezone.now()) - pending_agent_ttl()


def _fresh_q(now=None) -> Q:
    now = now or timezone.now()
    agent = Q(cluster__driver=ClusterDriver.AGENT)
    return (agent & Q(last_seen_at__gte=agent_stale_cutoff(now))) | (~agent & Q(last_seen_at__gte=stale_cutoff(now)))


def stale_q(now=None) -> Q:
    """The one stale rule as a filter for aggregates: never seen, or silent past its cluster's cutoff."""
    return Q(last_seen_at__isnull=True) | ~_fresh_q(now)


def is_stale(node, now=None) -> bool:
    """The same rule for one node whose cluster is loaded (API rows)."""
    agent = node.cluster.driver == ClusterDriver.AGENT
    cutoff = agent_stale_cutoff(now) if agent else stale_cutoff(now)
    return node.last_seen_at is None or node.last_seen_at < cutoff


class ClusterQuerySet(models.QuerySet):
    def with_counts(self, now=None):
        """Live nodes, pools, and the nodes whose agent reported within its cutoff: an agent cluster has no API
        server to connect to, so its agents reporting is what "connected" means."""
        return self.annotate(
            node_count=models.Count("nodes", filter=Q(nodes__gone_at__isnull=True), distinct=True),
            pool_count=models.Count("pools", distinct=True),
            agents_reporting=models.Count(
                "nodes",
                filter=Q(nodes__gone_at__isnull=True, nodes__last_seen_at__gte=agent_stale_cutoff(now)),
                distinct=True,
            ),
        )


class NodePoolQuerySet(models.QuerySet):
    def with_counts(self):
        return self.annotate(node_count=models.Count("nodes", filter=Q(nodes__gone_at__isnull=True)))


class NodeQuerySet(models.QuerySet):
    def live(self):
        return self.filter(gone_at__isnull=True)

    def in_cluster(self, cluster):
        return self.filter(cluster=cluster)

    def in_pool(self, pool):
        return self.filter(pool=pool)

    def stale(self, now=None):
        return self.exclude(_fresh_q(now))

    def fresh(self, now=None):
        return self.filter(_fresh_q(now))

    def with_gpu_summary(self):
        """GPU count, unhealthy count, mean utilisation and the products, computed in the database."""
        live_gpu = Q(gpus__gone_at__isnull=True)
        return self.annotate(
            gpu_count=models.Count("gpus", filter=live_gpu),
            # The same meaning as GpuQuerySet.unhealthy(): anything reported that is not healthy.
            unhealthy_gpu_count=models.Count("gpus", filter=live_gpu & ~Q(gpus__health__in=["healthy", "unknown"])),
            mean_utilization=models.Avg("gpus__utilization_pct", filter=live_gpu),
            product=models.Max("gpus__product", filter=live_gpu),
        )


class GpuQuerySet(models.QuerySet):
    def live(self):
        return self.filter(gone_at__isnull=True)

    def mig_capable(self):
        return self.filter(mig_capable=True)

    def mig_enabled(self):
        return self.filter(mig_enabled=True)

    def in_pool(self, pool):
        return self.filter(node__pool=pool)

    def in_cluster(self, cluster):
        return self.filter(node__cluster=cluster)

    def unhealthy(self):
        return self.exclude(health="healthy").exclude(health="unknown")


class MigDeviceQuerySet(models.QuerySet):
    def in_use(self):
        return self.exclude(in_use_by="")


class PendingAgentQuerySet(models.QuerySet):
    def _expired_q(self, now=None) -> Q:
        return Q(status="pending", requested_at__lt=pending_agent_cutoff(now))

    def expired(self, now=None):
        """Requests that waited for an admin longer than TESSERA["PENDING_AGENT_TTL_HOURS"]."""
        return self.filter(self._expired_q(now))

    def current(self, now=None):
        """Every request but the expired ones: what admins see and may decide."""
        return self.exclude(self._expired_q(now))
