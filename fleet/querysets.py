"""Reusable reads of the fleet, chainable: Gpu.objects.live().mig_capable().in_pool(pool)."""

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce
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


def gpu_summary_aggregates(prefix: str, live: Q) -> dict:
    """A node's GPU summary as aggregates over its GPUs (`prefix` reaches them; `live` keeps the live ones): count,
    unhealthy count, mean utilisation, the product and the last metrics sample."""
    return {
        "gpu_count": models.Count(f"{prefix}pk", filter=live),
        # The same meaning as GpuQuerySet.unhealthy(): anything reported that is not healthy.
        "unhealthy_gpu_count": models.Count(
            f"{prefix}pk", filter=live & ~Q(**{f"{prefix}health__in": ["healthy", "unknown"]})
        ),
        "mean_utilization": models.Avg(f"{prefix}utilization_pct", filter=live),
        "product": models.Max(f"{prefix}product", filter=live),
        "metrics_at": models.Max(f"{prefix}metrics_at", filter=live),
    }


def _related_count(queryset, related_name: str, **filters):
    """The count of an object's `related_name` rows as a subquery: counts of two relations side by side without
    joining both (a join multiplies them: pools x nodes rows per cluster)."""
    field = queryset.model._meta.get_field(related_name)
    rows = (
        field.related_model.objects.filter(**{field.field.name: models.OuterRef("pk")}, **filters)
        .order_by()
        .values(field.field.name)
        .annotate(n=models.Count("pk"))
        .values("n")
    )
    return Coalesce(models.Subquery(rows), 0)


class ClusterQuerySet(models.QuerySet):
    def with_counts(self, now=None):
        """Live nodes, pools, and the nodes whose agent reported within its cutoff: an agent cluster has no API
        server to connect to, so its agents reporting is what "connected" means."""
        return self.annotate(
            node_count=_related_count(self, "nodes", gone_at__isnull=True),
            pool_count=_related_count(self, "pools"),
            agents_reporting=_related_count(
                self, "nodes", gone_at__isnull=True, last_seen_at__gte=agent_stale_cutoff(now)
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
        return self.annotate(**gpu_summary_aggregates("gpus__", live=Q(gpus__gone_at__isnull=True)))


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
