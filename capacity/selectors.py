"""Reads of the recorded samples shaped for the capacity pages and the API: a pool's week of demand, the layout that
would have served it best (capacity.whatif), GPU-hours per namespace or team and how they reconcile."""

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.conf import settings
from django.db.models import Avg, F, FloatField, Sum
from django.db.models.functions import TruncDate

from capacity import whatif
from capacity.models import DemandSample, DemandSource, UsageSample
from fleet.models import Gpu, Node, NodePool

WEEK = timedelta(days=7)
GROUPS = {"namespace": "namespace", "team": "team"}


@dataclass(frozen=True)
class Window:
    """A window of the week in a time zone (weekdays 0 = Monday), as the recommendation form reads it."""

    weekdays: tuple[int, ...] = (0, 1, 2, 3, 4)
    start: time = time(8)
    end: time = time(20)
    tz: str = "UTC"

    def __contains__(self, at: datetime) -> bool:
        return whatif.in_window(at, tz=self.tz, weekdays=self.weekdays, start=self.start, end=self.end)


WEEK_FIELDS = ("capacity", "used", "used_gpus", "pending", "pending_units", "arrived", "arrived_units",
               "started_within_5min")  # fmt: skip


def week_demand(pool: NodePool, end: datetime) -> dict[datetime, dict[str, dict]]:
    """The week before `end`, per sample instant and resource, both sources summed (in Python: one row per source,
    read in the order of the (pool, at, …) index): the one query of the week (bench B7 times it)."""
    rows = (
        DemandSample.objects.filter(pool=pool, at__gte=end - WEEK, at__lt=end)
        .order_by()
        .values_list("at", "resource", "seconds", "gpu_share", *WEEK_FIELDS)
    )
    week: dict[datetime, dict[str, dict]] = defaultdict(dict)
    for at, resource, seconds, share, *values in rows.iterator(chunk_size=5000):
        found = week[at].get(resource)
        if found is None:
            week[at][resource] = {"seconds": seconds, "gpu_share": share, **dict(zip(WEEK_FIELDS, values, strict=True))}
        else:
            for name, value in zip(WEEK_FIELDS, values, strict=True):
                found[name] += value
    return dict(sorted(week.items()))


def week_utilisation(pool: NodePool, end: datetime) -> dict[str, tuple[float | None, float | None]]:
    """Per resource, DCGM's mean utilisation and memory in use (percent) over the pool's samples of the week before
    `end` (samples without a reading left out; None: no reading all week)."""
    rows = (
        DemandSample.objects.filter(pool=pool, at__gte=end - WEEK, at__lt=end, source=DemandSource.PODS)
        .values("resource")
        .annotate(util=Avg("utilization_pct"), memory=Avg("memory_used_pct"))
        .order_by()
    )
    return {row["resource"]: (row["util"], row["memory"]) for row in rows}


def _demand(row: dict) -> whatif.Demand:
    return whatif.Demand(
        capacity=row["capacity"],
        used=row["used"],
        pending_units=row["pending_units"],
        arrived=row["arrived"],
        arrived_units=row["arrived_units"],
        started_within_5min=row["started_within_5min"],
        gpu_share=row["gpu_share"],
    )


def pool_shape(pool: NodePool) -> tuple[int, int, list[str]]:
    """Live nodes, GPUs per node (the most common count) and GPU products of the pool."""
    node_ids = list(Node.objects.live().in_pool(pool).values_list("pk", flat=True))
    per_node = Counter(
        Gpu.objects.filter(node_id__in=node_ids, gone_at__isnull=True).values_list("node_id", flat=True)
    ).values()
    products = list(
        Gpu.objects.filter(node_id__in=node_ids, gone_at__isnull=True)
        .values_list("product", flat=True)
        .distinct()
        .order_by("product")
    )
    gpus = Counter(per_node).most_common(1)[0][0] if per_node else 0
    return len(node_ids), gpus, products


def recommendation(pool: NodePool, window: Window, week: dict[datetime, dict[str, dict]]) -> whatif.Recommendation:
    """The layout that would have served the window's demand of the recorded week (week_demand) best."""
    nodes, gpus, products = pool_shape(pool)
    samples = [
        (max((r["seconds"] for r in by_resource.values()), default=0), {r: _demand(v) for r, v in by_resource.items()})
        for at, by_resource in week.items()
        if at in window
    ]
    options = whatif.candidates(products, gpus_per_node=gpus, pool_nodes=nodes) if nodes and gpus else []
    return whatif.recommend(samples, pool_nodes=nodes, candidates=options)


def gpu_hours(*, start: date, end: date, group_by: str, pool: NodePool | None = None) -> list[dict]:
    """GPU-hours per day (the server's time zone), group (namespace or team value) and resource, from `start` to
    `end` inclusive; rows ordered by day, group, resource."""
    rows = UsageSample.objects.annotate(day=TruncDate("at")).filter(day__gte=start, day__lte=end)
    if pool is not None:
        rows = rows.filter(pool=pool)
    hours = Sum(F("gpus") * F("seconds"), output_field=FloatField()) / 3600.0
    found = (
        rows.values("day", group=F(GROUPS[group_by]))
        .annotate(gpu_hours=hours)
        .values("day", "group", "resource", "gpu_hours")
    )
    return sorted(
        ({**row, "gpu_hours": round(row["gpu_hours"], 4)} for row in found),
        key=lambda r: (r["day"], r["group"], r["resource"]),
    )


def pool_used_gpu_hours(*, start: date, end: date, pool: NodePool | None = None) -> float:
    """The pools' used capacity over the same days: GPU-equivalents held per sample × its seconds."""
    rows = DemandSample.objects.annotate(day=TruncDate("at")).filter(
        day__gte=start, day__lte=end, source=DemandSource.PODS
    )
    if pool is not None:
        rows = rows.filter(pool=pool)
    total = rows.aggregate(h=Sum(F("used_gpus") * F("seconds"), output_field=FloatField()))["h"] or 0.0
    return round(total / 3600.0, 4)


def reconciliation(rows: list[dict], *, start: date, end: date, pool: NodePool | None = None) -> dict:
    """The groups' sum against the pools' used capacity, and the sampling error the page states."""
    minutes = settings.TESSERA["CAPACITY"]["SAMPLE_MINUTES"]
    groups = round(sum(r["gpu_hours"] for r in rows), 4)
    used = pool_used_gpu_hours(start=start, end=end, pool=pool)
    return {
        "groups_gpu_hours": groups,
        "pool_used_gpu_hours": used,
        "difference_gpu_hours": round(groups - used, 4),
        "sample_minutes": minutes,
        "statement": (
            f"The groups sum to {groups:.2f} GPU-hours; the pools used {used:.2f} GPU-hours in the same samples. "
            f"Each sample counts what pods held at its instant for the {minutes} minutes that follow, so a pod's "
            f"GPU-hours are exact to within {minutes} minutes at its start and at its end."
        ),
    }
