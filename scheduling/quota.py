"""Kueue quota in step with a pool's layout: ResourceFlavor names and labels, and the nominalQuota each Tessera-owned
flavor should have at an instant. Pure (no Django, no I/O): the worker's sync and the schedule pages both call it.

One flavor per pool and GPU product (`tessera-<pool>-<product>`); its quota per GPU resource is, at any moment:

- `min(desired, reported)`: what the layout in force gives the pool's nodes of that product (sharing.spec
  .allocatable), but never more than the nodes report allocatable now — so a resource a transition creates is raised
  only as nodes report it, and one it removes is 0 from the transition on;
- ahead of a transition (within the lead time), a resource the next layout has less of is lowered further, to what
  is in use (the ClusterQueue's status.flavorsUsage): nothing new is admitted onto slices about to be reset.

Every flavor lists every resource any of the schedule's layouts gives (0 where none), so the ClusterQueue's covered
resources stay the same across transitions (Kueue requires each flavor of a group to list every covered resource).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sharing.spec import ProfileSpec, allocatable

FLAVOR_PREFIX = "tessera-"
NAME_LIMIT = 253  # a DNS subdomain (ResourceFlavor names)
PRODUCT_LABEL = "nvidia.com/gpu.product"

Quota = dict[str, dict[str, int]]  # flavor name -> resource -> count


def _slug(text: str) -> str:
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def flavor_name(pool: str, product: str) -> str:
    """`tessera-<pool>-<product>` as a DNS subdomain; long names keep a hash of the whole."""
    name = f"{FLAVOR_PREFIX}{_slug(pool) or 'pool'}-{_slug(product) or 'gpu'}"
    if len(name) > NAME_LIMIT:
        name = f"{name[: NAME_LIMIT - 9].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return name


def flavor_labels(pool_labels: Mapping[str, str], product: str, *, single_strategy: bool = False) -> dict[str, str]:
    """A flavor's nodeLabels: the labels every node of the pool carries, and the GPU product. Under the `single` MIG
    strategy GFD writes `<product>-MIG-<profile>` into the product label, which changes with each layout, so the
    flavor keeps the pool's labels only (kueue_binding_set refuses such a pool with several products)."""
    return dict(pool_labels) if single_strategy else {**pool_labels, PRODUCT_LABEL: product}


@dataclass(frozen=True)
class PoolNode:
    """One live node of the pool: its GPU product, its GPUs as (index, product), what it reports allocatable, and
    the profile (as a spec, under its cluster's strategy) it should run now and after the next transition (None:
    no opinion, the node counts with what it reports)."""

    product: str
    gpus: tuple[tuple[int, str], ...]
    reported: Mapping[str, int]
    now: ProfileSpec | None
    next: ProfileSpec | None = None


def _yield(node: PoolNode, spec: ProfileSpec | None) -> Mapping[str, int]:
    return allocatable(spec, node.gpus) if spec is not None else node.reported


def per_product(nodes: Iterable[PoolNode], pick) -> dict[str, dict[str, int]]:
    """Sum of `pick(node)` (a resource -> count mapping) per product."""
    totals: dict[str, dict[str, int]] = {}
    for node in nodes:
        bucket = totals.setdefault(node.product, {})
        for resource, count in pick(node).items():
            bucket[resource] = bucket.get(resource, 0) + int(count)
    return totals


def layout_quota(nodes: Sequence[PoolNode], which: str = "now") -> dict[str, dict[str, int]]:
    """What the layout (the nodes' `now` or `next` profile) gives per product: the quota once nodes report it."""
    return per_product(nodes, lambda n: _yield(n, getattr(n, which)))


def covered(nodes: Sequence[PoolNode], specs: Iterable[ProfileSpec]) -> list[str]:
    """Every GPU resource the pool's nodes report or any of `specs` would give them, sorted."""
    names = {r for n in nodes for r in n.reported}
    for spec in specs:
        names |= {r for n in nodes for r in allocatable(spec, n.gpus)}
    return sorted(names)


def targets(
    nodes: Sequence[PoolNode],
    resources: Sequence[str],
    *,
    transition_ahead: bool,
    in_use: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, int]]:
    """Per product, the nominalQuota of every resource in `resources` now (see the module docstring). `in_use` is
    per product too."""
    now = layout_quota(nodes, "now")
    reported = per_product(nodes, lambda n: n.reported)
    after = layout_quota(nodes, "next") if transition_ahead else {}
    result = {}
    for product in sorted(now.keys() | reported.keys()):
        quota = {}
        for resource in resources:
            desired = now.get(product, {}).get(resource, 0)
            value = min(desired, reported.get(product, {}).get(resource, 0))
            if transition_ahead and after.get(product, {}).get(resource, 0) < desired:
                value = min(value, in_use.get(product, {}).get(resource, 0))
            quota[resource] = value
        result[product] = quota
    return result


@dataclass(frozen=True)
class QuotaChange:
    """One flavor's resource across a transition: the quota before and once the nodes report the new layout."""

    flavor: str
    resource: str
    before: int
    after: int


def transition_changes(pool: str, nodes: Sequence[PoolNode], resources: Sequence[str]) -> list[QuotaChange]:
    """Quota before → after a transition whose nodes go from their `now` to their `next` profile (what the preview
    and the schedule page show); resources at 0 on both sides are left out."""
    before, after = layout_quota(nodes, "now"), layout_quota(nodes, "next")
    rows = []
    for product in sorted(before.keys() | after.keys()):
        for resource in resources:
            old, new = before.get(product, {}).get(resource, 0), after.get(product, {}).get(resource, 0)
            if old or new:
                rows.append(QuotaChange(flavor_name(pool, product), resource, old, new))
    return rows
