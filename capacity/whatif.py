"""What-if replay of a pool's recorded demand against candidate layouts: a pure core, no Django and no I/O.

The replay is greedy and memoryless, one sample at a time, resource by resource:

1. A candidate puts `nodes` of the pool's N nodes at one layout (the same MIG layout on every GPU, or whole GPUs);
   the other N − nodes keep what they offered when the sample was taken, pro rata (today's capacity × (N−nodes)/N).
2. The demand present before the sample's arrivals — pods holding the resource plus pods (and Kueue Workloads)
   waiting for it, less what arrived in this sample — is served first.
3. The pods that arrived in the sample (created since the previous one) are then served in arrival order, each
   taking its mean share of the arrived units, while the candidate's capacity of their resource has room: each one
   served "would have started within 5 minutes" (one sample interval, at most 5 minutes by default). Nothing is
   carried to the next sample: a pod that did not fit is counted in that sample's demand again if it still waited.
4. Idle GPU-hours are the capacity the demand (held plus waiting, capped at capacity) left unused, each unit weighted
   by its share of a GPU (a 3g slice of a 7-slice GPU is 3/7), over the candidate's whole capacity.

The best candidate starts the most arrivals within 5 minutes; among equals, the one with the least idle share, then
the one changing fewer nodes. Demand for a resource the candidate does not offer is never served.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time
from zoneinfo import ZoneInfo

from sharing.mig import format_layout, get_product, maximal_layouts, mig_resources, validate_layout
from sharing.mig.catalog import UnknownProductError

WHOLE_GPU = "nvidia.com/gpu"
NODE_STEPS = 8  # node counts tried: 1…8, then eighths of the pool


@dataclass(frozen=True)
class Demand:
    """One resource at one sample, as recorded (capacity.models.DemandSample, sources summed)."""

    capacity: float
    used: float
    pending_units: float
    arrived: int
    arrived_units: float
    started_within_5min: int
    gpu_share: float = 1.0


@dataclass(frozen=True)
class Candidate:
    """`nodes` of the pool at `layout` (MIG profile → count per GPU; None: whole GPUs); `per_node`: the resources one
    such node offers; `shares`: each resource's share of a GPU."""

    nodes: int
    layout: Mapping[str, int] | None
    per_node: Mapping[str, int]
    shares: Mapping[str, float] = field(default_factory=dict)

    @property
    def layout_text(self) -> str:
        return format_layout(self.layout) if self.layout else "whole GPUs"

    @property
    def label(self) -> str:
        return f"{self.nodes} node{'s' if self.nodes != 1 else ''} at {self.layout_text}"


@dataclass(frozen=True)
class Outcome:
    """How a candidate (None: the pool as it was) would have served the demand of the window."""

    candidate: Candidate | None
    waiting: int
    started_within_5min: int
    idle_pct: float
    capacity_gpu_hours: float

    @property
    def label(self) -> str:
        return self.candidate.label if self.candidate else "today"


@dataclass(frozen=True)
class Recommendation:
    today: Outcome
    best: Outcome | None
    outcomes: tuple[Outcome, ...]

    @property
    def sentence(self) -> str:
        """ "4 nodes at 3g.40gb ×2: 14 of 17 waiting pods would have started within 5 min (today 3); idle GPU-hours
        38 % → 12 %"."""
        if self.best is None:
            return "No layout of the MIG catalog fits this pool's GPUs."
        best, today = self.best, self.today
        return (
            f"{best.label}: {best.started_within_5min} of {best.waiting} waiting pods would have started within "
            f"5 min (today {today.started_within_5min}); idle GPU-hours {today.idle_pct:.0f} % → {best.idle_pct:.0f} %"
        )


def in_window(at: datetime, *, tz: str, weekdays: Iterable[int], start: time, end: time) -> bool:
    """Whether the aware instant falls in the weekly window (local weekdays 0 = Monday; end ≤ start runs past
    midnight and belongs to the day it started)."""
    local = at.astimezone(ZoneInfo(tz))
    days, clock = frozenset(weekdays), local.time()
    if start < end:
        return local.weekday() in days and start <= clock < end
    return (local.weekday() in days and clock >= start) or ((local.weekday() - 1) % 7 in days and clock < end)


def _replay(
    samples: Sequence[tuple[float, Mapping[str, Demand]]], pool_nodes: int, candidate: Candidate | None
) -> Outcome:
    waiting = started = 0
    idle = total = 0.0
    kept = (pool_nodes - candidate.nodes) / pool_nodes if candidate and pool_nodes else 1.0
    for seconds, by_resource in samples:
        resources = set(by_resource) | set(candidate.per_node if candidate else ())
        for resource in resources:
            demand = by_resource.get(resource)
            share = (candidate.shares.get(resource) if candidate else None) or (demand.gpu_share if demand else 1.0)
            today = demand.capacity if demand else 0.0
            offered = candidate.per_node.get(resource, 0) * candidate.nodes if candidate else 0
            capacity = offered + today * kept
            if demand is None:
                total += capacity * share * seconds
                idle += capacity * share * seconds
                continue
            waiting += demand.arrived
            if candidate is None:
                started += demand.started_within_5min
            elif demand.arrived:
                present = max(0.0, demand.used + demand.pending_units - demand.arrived_units)
                unit = demand.arrived_units / demand.arrived or 1.0
                room = max(0.0, capacity - present)
                started += min(demand.arrived, int(room / unit + 1e-9))
            load = min(capacity, demand.used if candidate is None else demand.used + demand.pending_units)
            total += capacity * share * seconds
            idle += (capacity - load) * share * seconds
    return Outcome(
        candidate=candidate,
        waiting=waiting,
        started_within_5min=started,
        idle_pct=round(100 * idle / total, 1) if total else 0.0,
        capacity_gpu_hours=round(total / 3600, 2),
    )


def recommend(
    samples: Sequence[tuple[float, Mapping[str, Demand]]], *, pool_nodes: int, candidates: Iterable[Candidate]
) -> Recommendation:
    """Replay the samples (each: the seconds it stands for, demand per resource) against every candidate and today's
    pool; the best as the module docstring says (None without candidates)."""
    today = _replay(samples, pool_nodes, None)
    outcomes = tuple(_replay(samples, pool_nodes, c) for c in candidates)
    best = min(outcomes, key=lambda o: (-o.started_within_5min, o.idle_pct, o.candidate.nodes), default=None)
    return Recommendation(today=today, best=best, outcomes=outcomes)


def node_counts(pool_nodes: int) -> list[int]:
    """The node counts tried: every one up to NODE_STEPS, then NODE_STEPS evenly spaced counts up to the pool."""
    counts = set(range(1, min(pool_nodes, NODE_STEPS) + 1))
    counts |= {max(1, round(pool_nodes * k / NODE_STEPS)) for k in range(1, NODE_STEPS + 1)}
    return sorted(c for c in counts if c <= pool_nodes)


def candidates(products: Sequence[str], *, gpus_per_node: int, pool_nodes: int) -> list[Candidate]:
    """Every maximal MIG layout of the catalog valid on all the pool's products (the first one's menu), and whole
    GPUs, at each of node_counts(pool_nodes) nodes. Products outside the catalog offer whole GPUs only."""
    try:
        catalog = [get_product(p) for p in dict.fromkeys(products)]
    except UnknownProductError:
        catalog = []
    layouts: list[Mapping[str, int] | None] = [None]
    if catalog and all(p.mig_capable for p in catalog):
        first = catalog[0]
        layouts += [
            layout
            for layout in maximal_layouts(first)
            if all(validate_layout(product, layout).valid for product in catalog[1:])
        ]
    found = []
    for layout in layouts:
        if layout is None:
            per_gpu, shares = {WHOLE_GPU: 1}, {WHOLE_GPU: 1.0}
        else:
            first = catalog[0]
            per_gpu = mig_resources(first, layout)
            shares = {
                first.mig_profile(name).resource_name: first.mig_profile(name).compute_slices / first.compute_slices
                for name in layout
            }
        per_node = {resource: count * gpus_per_node for resource, count in per_gpu.items()}
        found += [Candidate(nodes=n, layout=layout, per_node=per_node, shares=shares) for n in node_counts(pool_nodes)]
    return found
