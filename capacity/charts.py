"""Geometry of the capacity pages' SVG charts, drawn on the server (no chart library, no script: the CSP allows
none inline): demand against capacity over a week per resource, and GPU-hours per day stacked by group."""

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 160, 44, 22, 8
# Fills for the stacked bars' groups (colour-blind safe, Okabe–Ito); the legend repeats them with names.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")


def _nice(top: float) -> float:
    """A round axis maximum at or above `top`."""
    if top <= 0:
        return 1.0
    step = 10 ** (len(str(int(top))) - 1)
    for factor in (1, 2, 5, 10):
        if top <= factor * step:
            return float(factor * step)
    return float(10 * step)


@dataclass(frozen=True)
class DayPeaks:
    """One day of a WeekChart in numbers: the highest capacity, demand and held of its samples (None: no sample)."""

    label: str
    capacity: float | None
    demand: float | None
    held: float | None

    @property
    def short(self) -> bool:
        """Whether demand went above capacity at its peak that day (the chart's lines crossing)."""
        return self.demand is not None and self.demand > (self.capacity or 0)


@dataclass(frozen=True)
class WeekChart:
    resource: str
    width: int
    height: int
    left: int
    plot_bottom: int
    axis_max: float
    capacity: str  # polyline points
    demand: str
    used: str
    days: tuple[tuple[float, str], ...]  # x, label
    peak_demand: float
    peak_capacity: float
    utilization_pct: float | None = None  # DCGM's week mean, percent (None: no reading)
    memory_used_pct: float | None = None
    per_day: tuple[DayPeaks, ...] = ()  # the chart's text alternative: the same week as numbers


def _per_day(points, start: datetime) -> tuple[DayPeaks, ...]:
    days = []
    for i in range(7):
        low, high = start + timedelta(days=i), start + timedelta(days=i + 1)
        inside = [p for p in points if low <= p[0] < high]
        capacity, demand, held = (max((p[n] for p in inside), default=None) for n in (1, 2, 3))
        days.append(DayPeaks(low.strftime("%a %d"), capacity, demand, held))
    return tuple(days)


def week_charts(
    week: dict[datetime, dict[str, dict]], start: datetime, utilisation: dict[str, tuple] | None = None
) -> list[WeekChart]:
    """One chart per resource: capacity (steps), demand (held + waiting) and held, over the 7 days from `start`, with
    DCGM's week mean utilisation and memory in use per resource (`utilisation`: resource -> (util, memory))."""
    utilisation = utilisation or {}
    span = timedelta(days=7).total_seconds()
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    series: dict[str, list[tuple[datetime, float, float, float]]] = defaultdict(list)
    resources = {resource for by_resource in week.values() for resource in by_resource}
    for at in sorted(week):
        for resource in resources:  # a resource not in a sample was neither offered nor asked for then: 0
            row = week[at].get(resource)
            values = (row["capacity"], row["used"] + row["pending_units"], row["used"]) if row else (0, 0, 0)
            series[resource].append((at, *values))
    days = tuple((round(LEFT + plot_w * i / 7, 1), (start + timedelta(days=i)).strftime("%a %d")) for i in range(7))
    charts = []
    for resource in sorted(series):
        points = series[resource]
        top = _nice(max(max(c, d) for _, c, d, _ in points))

        def xy(at, value, top=top):
            x = LEFT + plot_w * min(1.0, max(0.0, (at - start).total_seconds() / span))
            return f"{x:.1f},{TOP + plot_h * (1 - value / top):.1f}"

        charts.append(
            WeekChart(
                resource=resource,
                width=WIDTH,
                height=HEIGHT,
                left=LEFT,
                plot_bottom=TOP + plot_h,
                axis_max=top,
                capacity=" ".join(xy(at, c) for at, c, _, _ in points),
                demand=" ".join(xy(at, d) for at, _, d, _ in points),
                used=" ".join(xy(at, u) for at, _, _, u in points),
                days=days,
                peak_demand=max(d for _, _, d, _ in points),
                peak_capacity=max(c for _, c, _, _ in points),
                utilization_pct=utilisation.get(resource, (None, None))[0],
                memory_used_pct=utilisation.get(resource, (None, None))[1],
                per_day=_per_day(points, start),
            )
        )
    return charts


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    fill: str
    title: str
    group: str


@dataclass(frozen=True)
class StackedChart:
    width: int
    height: int
    left: int
    plot_bottom: int
    axis_max: float
    bars: tuple[Bar, ...]
    days: tuple[tuple[float, str], ...]
    legend: tuple[tuple[str, str], ...]  # group label, fill


def stacked_days(rows: list[dict], start: date, end: date) -> StackedChart:
    """GPU-hours per day, one bar per day stacked by group (resources summed), groups in a fixed order."""
    per_day: dict[date, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        per_day[row["day"]][row["group"]] += row["gpu_hours"]
    groups = sorted({row["group"] for row in rows})
    fills = {g: PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}
    days = [start + timedelta(days=i) for i in range((end - start).days + 1)]
    top = _nice(max((sum(v.values()) for v in per_day.values()), default=0))
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(1, len(days))
    bars = []
    for i, day in enumerate(days):
        base = 0.0
        for group in groups:
            hours = per_day[day].get(group, 0.0)
            if hours <= 0:
                continue
            height = plot_h * hours / top
            y = TOP + plot_h - plot_h * base / top - height
            label = group or "(none)"
            bars.append(
                Bar(
                    x=round(LEFT + slot * i + slot * 0.15, 1),
                    y=round(y, 1),
                    width=round(slot * 0.7, 1),
                    height=round(height, 1),
                    fill=fills[group],
                    title=f"{day:%a %d %b} · {label}: {hours:.2f} GPU-hours",
                    group=label,
                )
            )
            base += hours
    labels = tuple((round(LEFT + slot * (i + 0.5), 1), f"{d:%a %d}") for i, d in enumerate(days))
    return StackedChart(
        width=WIDTH,
        height=HEIGHT,
        left=LEFT,
        plot_bottom=TOP + plot_h,
        axis_max=top,
        bars=tuple(bars),
        days=labels,
        legend=tuple((g or "(none)", fills[g]) for g in groups),
    )
