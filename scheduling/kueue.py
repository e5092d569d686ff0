"""A pool's Kueue binding: its writes (audited) and what its quota is and becomes, read from the pool's layout.

The arithmetic is `scheduling.quota` (pure); this module feeds it the pool's live nodes, their GPUs, what they report
and the profile each should run at two instants (now, and just after the next transition). The worker's sync
(worker/kueue.py) writes the result to the cluster; the schedule page shows it per transition.
"""

import re
from dataclasses import dataclass, replace
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.choices import ClusterMigStrategy
from fleet.labels import parse_selector
from fleet.models import Gpu, NodePool
from scheduling import quota
from scheduling.models import KueueBinding, Schedule
from scheduling.selectors import ScheduledTransition, desired_states, gpu_shapes, schedule_transitions
from sharing.spec import under_cluster_strategy

AFTER = timedelta(seconds=1)  # "just after a transition": the instant whose desired state is the new one
MAX_LEAD_MINUTES = 7 * 24 * 60
NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"  # ClusterQueue names (kueue CRD)


def pool_labels(pool: NodePool) -> dict[str, str]:
    """The labels every node of a selector pool carries (its `key=value` terms); {} for explicit members."""
    try:
        requirements = parse_selector(pool.node_selector)
    except ValueError:
        return {}
    return {r.key: next(iter(r.values)) for r in requirements if r.operator == "in" and len(r.values) == 1}


def _product(node, gpus) -> str:
    label = (node.labels or {}).get(quota.PRODUCT_LABEL) or (gpus[0][1] if gpus else "")
    # Under the single strategy GFD appends -MIG-<profile> (contracts §3.6): the flavor names the GPU, not its layout.
    return label.split("-MIG-")[0].removesuffix("-SHARED") if label else "unknown"


def _spec(profile, strategy):
    return under_cluster_strategy(profile.to_spec(), strategy) if profile is not None else None


def pool_flavors(pool: NodePool) -> set[str]:
    """The names of the ResourceFlavors Tessera keeps for the pool: one per GPU product of its live nodes."""
    nodes = list(pool.nodes.live())
    shapes = gpu_shapes(n.pk for n in nodes)
    return {quota.flavor_name(pool.name, _product(n, shapes.get(n.pk, ()))) for n in nodes}


def pool_nodes(pool: NodePool, *, at, after=None) -> list[quota.PoolNode]:
    """The pool's live nodes as `scheduling.quota` reads them: profile at `at`, and at `after` when given."""
    nodes = list(pool.nodes.live().select_related("cluster"))
    shapes = gpu_shapes(n.pk for n in nodes)
    now = desired_states(nodes, at=at)
    later = desired_states(nodes, at=after) if after is not None else {}
    strategy = pool.cluster.mig_strategy
    result = []
    for node in nodes:
        gpus = shapes.get(node.pk, ())
        result.append(
            quota.PoolNode(
                product=_product(node, gpus),
                gpus=gpus,
                reported={k: int(v) for k, v in (node.allocatable or {}).items()},
                now=_spec(now[node.pk].profile, strategy),
                next=_spec(later[node.pk].profile, strategy) if node.pk in later else None,
            )
        )
    return result


def schedule_specs(pool: NodePool) -> list:
    """Every profile the pool's schedule and default may put in force, as specs (the resources to cover)."""
    strategy = pool.cluster.mig_strategy
    profiles = []
    schedule = Schedule.objects.filter(pool=pool).prefetch_related("windows__profile").first()
    if schedule is not None:
        profiles += [w.profile for w in schedule.windows.all()] + [schedule.baseline_profile]
    default = getattr(getattr(pool, "sharing", None), "profile", None)
    return [_spec(p, strategy) for p in {*profiles, default} - {None}]


@dataclass(frozen=True)
class QuotaPlan:
    """What the sync should write now: per flavor, nodeLabels and nominalQuota per covered resource."""

    pool: str
    resources: list[str]
    labels: dict[str, dict[str, str]]  # flavor -> nodeLabels
    products: dict[str, str]  # flavor -> product
    transition: ScheduledTransition | None  # within the lead time
    nodes: list[quota.PoolNode]

    def quota(self, in_use: dict[str, dict[str, int]], *, ahead: bool = True) -> dict[str, dict[str, int]]:
        """Per flavor and resource, given what is in use per flavor (from the ClusterQueue's status); `ahead=False`
        leaves out the lowering for the transition within the lead time."""
        by_product = {self.products[f]: used for f, used in in_use.items() if f in self.products}
        wanted = quota.targets(
            self.nodes, self.resources, transition_ahead=ahead and self.transition is not None, in_use=by_product
        )
        return {quota.flavor_name(self.pool, product): q for product, q in wanted.items()}

    def rows(self) -> list[dict]:
        """What the pool page shows per flavor and resource: what the layout in force gives (capped by what the
        nodes report), and whether the transition within the lead time lowers it to what is in use."""
        full, low = self.quota({}, ahead=False), self.quota({})
        return [
            {"flavor": flavor, "resource": resource, "value": value, "lowered": low[flavor][resource] < value}
            for flavor, resources in full.items()
            for resource, value in resources.items()
        ]


def _single_strategy(pool: NodePool) -> bool:
    return pool.cluster.mig_strategy == ClusterMigStrategy.SINGLE


def _products(pool: NodePool) -> list[str]:
    """The GPU products of the pool's live nodes."""
    return sorted(set(Gpu.objects.live().filter(node__in=pool.nodes.live()).values_list("product", flat=True)))


def quota_plan(binding: KueueBinding, *, at=None) -> QuotaPlan:
    """The pool's flavors and what decides their quota at `at`: the layout in force, and the next transition when
    it is within the binding's lead time."""
    at = at or timezone.now()
    pool = binding.pool
    schedule = Schedule.objects.filter(pool=pool, enabled=True).prefetch_related("windows", "exceptions").first()
    upcoming = None
    if schedule is not None:
        upcoming = next(iter(schedule_transitions(schedule, at, at + timedelta(minutes=binding.lead_minutes))), None)
    nodes = pool_nodes(pool, at=at, after=upcoming.at + AFTER if upcoming else None)
    base = pool_labels(pool)
    products = {quota.flavor_name(pool.name, n.product): n.product for n in nodes}
    return QuotaPlan(
        pool=pool.name,
        resources=quota.covered(nodes, schedule_specs(pool)),
        labels={
            name: quota.flavor_labels(base, product, single_strategy=_single_strategy(pool))
            for name, product in products.items()
        },
        products=products,
        transition=upcoming,
        nodes=nodes,
    )


def transition_quota(pool: NodePool, transition: ScheduledTransition) -> list[quota.QuotaChange]:
    """Quota before → after one transition of the pool's schedule (once its nodes report the new layout)."""
    nodes = pool_nodes(pool, at=transition.at - AFTER, after=transition.at + AFTER)
    return quota.transition_changes(pool.name, nodes, quota.covered(nodes, schedule_specs(pool)))


def profile_quota(pool: NodePool, profile, *, at=None) -> list[quota.QuotaChange]:
    """Quota before → after applying `profile` to every live node of the pool (the profile preview)."""
    return quota_steps(pool, pool_nodes(pool, at=at or timezone.now()), [profile])[0]


def quota_steps(pool: NodePool, nodes: list[quota.PoolNode], profiles: list) -> list[list[quota.QuotaChange]]:
    """Quota before → after each of `profiles` put in force in turn on `nodes` (pool_nodes, read before the first;
    None: no step): a config plan's change now, then at the next switch."""
    specs = [*schedule_specs(pool)]
    steps = []
    for profile in profiles:
        if profile is None:
            steps.append([])
            continue
        spec = _spec(profile, pool.cluster.mig_strategy)
        moved = [replace(node, next=spec) for node in nodes]
        steps.append(quota.transition_changes(pool.name, moved, quota.covered(moved, [*specs, spec])))
        nodes = [replace(node, now=spec) for node in nodes]
    return steps


def quota_text(changes: list[quota.QuotaChange]) -> str:
    """Quota before → after in one line, per flavor (the week timeline's tooltips)."""
    flavors: dict[str, list[str]] = {}
    for change in changes:
        flavors.setdefault(change.flavor, []).append(f"{change.resource} {change.before} → {change.after}")
    return "; ".join(f"{flavor}: {', '.join(parts)}" for flavor, parts in flavors.items()) or "no GPU resource"


def binding_snapshot(binding: KueueBinding) -> dict:
    return {
        "enabled": binding.enabled,
        "cluster_queues": list(binding.cluster_queues),
        "lead_minutes": binding.lead_minutes,
    }


@transaction.atomic
def kueue_binding_set(
    *, actor: Actor, pool: NodePool, cluster_queues: list[str], enabled: bool = True, lead_minutes: int = 15
) -> KueueBinding:
    """Have Tessera keep `cluster_queues`' quota for the pool's flavors in step with its layout (or stop, with
    `enabled=False`: what was written stays)."""
    errors = {}
    if not 0 <= lead_minutes <= MAX_LEAD_MINUTES:
        errors["lead_minutes"] = [f"Between 0 and {MAX_LEAD_MINUTES} minutes (a week)."]
    bad = [name for name in cluster_queues if not re.match(NAME, name or "") or len(name) > 253]
    if bad or not cluster_queues:
        errors["cluster_queues"] = [f"Not a ClusterQueue name: {name!r}." for name in bad] or ["Name at least one."]
    if pool.cluster.driver != "kubernetes":
        errors["pool"] = ["Kueue runs in Kubernetes clusters; this pool's cluster uses node agents."]
    elif _single_strategy(pool) and len(products := _products(pool)) > 1:
        errors["pool"] = [
            "Under the single MIG strategy GFD's nvidia.com/gpu.product label names the MIG profile, so a flavor "
            f"cannot tell this pool's GPU products ({', '.join(products)}) apart: make a pool per product."
        ]
    if errors:
        raise ApplicationError("The Kueue binding is not valid.", errors=errors)
    binding, created = KueueBinding.objects.select_for_update().get_or_create(pool=pool)
    before = None if created else binding_snapshot(binding)
    binding.cluster_queues = sorted(set(cluster_queues))
    binding.enabled = enabled
    binding.lead_minutes = lead_minutes
    binding.save()
    after = binding_snapshot(binding)
    if after != before:
        audit_record(actor=actor, action="kueue.binding", obj=binding, before=before, after=after)
    return binding


@transaction.atomic
def kueue_binding_delete(*, actor: Actor, binding: KueueBinding) -> None:
    """Tessera stops keeping the pool's Kueue quota and forgets the binding; what was written in the cluster stays."""
    audit_record(actor=actor, action="kueue.binding_delete", obj=binding, before=binding_snapshot(binding))
    binding.delete()
