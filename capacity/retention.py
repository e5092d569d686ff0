"""Demand and usage samples are kept RETENTION["DEMAND_DAYS"]: last week's replay and a month of GPU-hours."""

from datetime import datetime

from django.utils import timezone

from capacity.models import DemandSample, UsageSample
from core.retention import cutoff, delete_in_batches


def capacity_prune(*, now: datetime | None = None) -> dict:
    """Delete samples older than DEMAND_DAYS; returns the rows deleted by kind."""
    before = cutoff("DEMAND_DAYS", now or timezone.now())
    return {
        "demand_samples": delete_in_batches(DemandSample.objects.filter(at__lt=before)),
        "usage_samples": delete_in_batches(UsageSample.objects.filter(at__lt=before)),
    }
