"""QoS policies enforced at admission: per Kubernetes cluster, one ValidatingAdmissionPolicy and binding for every pool
whose QoS policy in force now (schedule window, baseline or pool default) has `enforce_admission`, kept level-
triggered like the rest of the worker: compare wanted with what the cluster shows, write the difference, record the
result per pool (AdmissionPolicyState) for the UI and the API. A repeated pass writes nothing to the cluster.

Agent clusters have no API server: their enforcing pools are recorded as not applicable (compliance reports still
check the rules there). HTTP never runs inside a database transaction.
"""

import hashlib
import logging
import re
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.audit import Actor, audit_record
from fleet.choices import ClusterDriver
from fleet.labels import parse_selector
from fleet.models import Cluster, NodePool
from scheduling.selectors import pool_states
from sharing.models import QoSPolicy
from sharing.render import render_admission_manifests, render_admission_policy
from worker.drivers.base import DriverError
from worker.drivers.kubernetes.admission import AdmissionPolicies, Outcome, Wanted
from worker.models import AdmissionPolicyState, AdmissionState

log = logging.getLogger(__name__)

ACTOR = Actor.system("admission")
NAME_PREFIX = "tessera-"
NAME_LIMIT = 253  # a DNS subdomain
POOL_LABEL_KEY = "tessera.io/pool"  # preferred when a pool's selector has several labels
AUDIT_VERBS = {"created": "create", "replaced": "replace", "deleted": "delete"}
AGENT_CLUSTER = (
    "Agent clusters have no Kubernetes API server to enforce admission; the compliance report checks the rules."
)


# --- what is wanted -----------------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")


def object_name(policy: QoSPolicy, pool: NodePool) -> str:
    """`tessera-<policy>-<pool>`: a DNS subdomain of at most 253 characters, the same for the policy and binding."""
    name = f"{NAME_PREFIX}{_slug(policy.name) or f'policy-{policy.pk}'}-{_slug(pool.name) or f'pool-{pool.pk}'}"
    if len(name) > NAME_LIMIT:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: NAME_LIMIT - 9].rstrip('-')}-{digest}"
    return name


def pool_admission_label(pool: NodePool) -> str:
    """The one node label (`key=value` or `key`) a pod names to ask for the pool's nodes, from its selector:
    `tessera.io/pool` when the selector has it, else its first single-valued or existence term. Raises ValueError
    when there is none (explicit members, only negative or multi-valued terms)."""
    try:
        requirements = parse_selector(pool.node_selector)
    except ValueError as exc:
        raise ValueError(f"the node selector of pool {pool.name} is invalid: {exc}") from None
    usable = [r for r in requirements if r.operator == "exists" or (r.operator == "in" and len(r.values) == 1)]
    if not usable:
        why = "has explicit members" if not requirements else f"selects nodes by {pool.node_selector!r}"
        raise ValueError(
            f"pool {pool.name} {why}: admission can only recognise pods that ask for one node label "
            "(key=value or key); give the pool a label selector such as tessera.io/pool=<name>"
        )
    chosen = next((r for r in usable if r.key == POOL_LABEL_KEY), usable[0])
    return f"{chosen.key}={next(iter(chosen.values))}" if chosen.operator == "in" else chosen.key


@dataclass(frozen=True)
class DesiredAdmission:
    """What one pool should have in its cluster now; `error` when the policy cannot be rendered for it."""

    pool: NodePool
    policy: QoSPolicy
    name: str
    manifest: str = ""
    manifest_hash: str = ""
    wanted: Wanted | None = None
    error: str = ""


def render_for_pool(policy: QoSPolicy, pool: NodePool, name: str) -> DesiredAdmission:
    """The pool's policy and binding, annotated with where they come from; a render refusal becomes `error`."""
    try:
        rendered = render_admission_policy(
            name,
            required_qos=policy.required_qos,
            required_priority_class=policy.required_priority_class,
            node_pool_label=pool_admission_label(pool),
        )
    except ValueError as exc:
        return DesiredAdmission(pool, policy, name, error=f"Cannot enforce {policy.name} on {pool.name}: {exc}")
    annotations = {"tessera.io/qos-policy": policy.name, "tessera.io/pool": pool.name}
    for obj in rendered:
        obj["metadata"]["annotations"] = dict(annotations)
    manifest = render_admission_manifests(*rendered)
    digest = hashlib.sha256(manifest.encode()).hexdigest()
    return DesiredAdmission(pool, policy, name, manifest, digest, Wanted(name, *rendered, digest))


def desired_admissions(pools, *, at=None) -> dict[int, DesiredAdmission]:
    """Pool id -> what it should enforce at `at` (default now), for the pools whose QoS policy in force has
    `enforce_admission`. Names are unique per cluster: pools whose names would collide get their id appended."""
    pools = list(pools)
    states = pool_states([p.pk for p in pools], at=at)
    enforcing = []
    for pool in sorted(pools, key=lambda p: p.pk):
        policy = states[pool.pk].qos_policy
        if policy is not None and policy.enforce_admission:
            enforcing.append((pool, policy, object_name(policy, pool)))
    seen: dict[tuple[int, str], int] = {}
    for pool, _, name in enforcing:
        seen[(pool.cluster_id, name)] = seen.get((pool.cluster_id, name), 0) + 1
    result = {}
    for pool, policy, name in enforcing:
        if seen[(pool.cluster_id, name)] > 1:
            name = f"{name[: NAME_LIMIT - 12].rstrip('-')}-{pool.pk}"
        result[pool.pk] = render_for_pool(policy, pool, name)
    return result


# --- the pass -----------------------------------------------------------------------------------------------------


@dataclass
class SyncResult:
    """What one pass did in one cluster (the task's return value, JSON)."""

    cluster: str
    wanted: int = 0
    created: int = 0
    replaced: int = 0
    deleted: int = 0
    errors: int = 0
    skipped: str = ""

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v or k in ("cluster", "wanted")}


def admission_sync(*, cluster: Cluster, now=None) -> SyncResult:
    """Bring one cluster's Tessera-managed admission policies to what its pools' QoS policies want now; record the
    outcome per pool and audit every write. Never raises for the cluster's own errors: they are recorded."""
    now = now or timezone.now()
    desired = desired_admissions(NodePool.objects.filter(cluster=cluster).select_related("cluster"), at=now)
    result = SyncResult(cluster.name, wanted=len(desired))
    if cluster.driver == ClusterDriver.AGENT:
        _record_not_applicable(cluster, desired, now)
        result.skipped = AGENT_CLUSTER
        return result
    has_rows = AdmissionPolicyState.objects.filter(cluster=cluster).exists()
    try:
        policies = AdmissionPolicies(cluster)
        observed = policies.observed()
    except DriverError as exc:
        if desired or has_rows:
            _record_unreachable(cluster, desired, str(exc), now)
            result.errors = len(desired)
        result.skipped = str(exc)
        return result
    if not desired and not observed and not has_rows:
        return result
    outcomes = policies.sync([d.wanted for d in desired.values() if d.wanted], observed)
    _record(cluster, desired, outcomes, now, result)
    return result


def _row_values(item: DesiredAdmission) -> dict:
    return {
        "pool_name": item.pool.name,
        "qos_policy": item.policy,
        "policy_name": item.policy.name,
        "object_name": item.name,
        "manifest": item.manifest,
        "manifest_hash": item.manifest_hash,
    }


def _save(row: AdmissionPolicyState | None, cluster: Cluster, pool: NodePool | None, values: dict) -> None:
    """Create the row, or update only when something other than `checked_at` changed (else one cheap update)."""
    if row is None:
        AdmissionPolicyState.objects.update_or_create(cluster=cluster, pool=pool, defaults=values)
        return
    changed = {k: v for k, v in values.items() if k != "checked_at" and getattr(row, k) != v}
    if changed:
        for key, value in values.items():
            setattr(row, key, value)
        row.save()
    elif "checked_at" in values:
        AdmissionPolicyState.objects.filter(pk=row.pk).update(checked_at=values["checked_at"])


def _rows(cluster: Cluster) -> tuple[dict[int, AdmissionPolicyState], list[AdmissionPolicyState]]:
    """The cluster's rows: by pool for live pools, and those whose pool is gone."""
    rows = list(
        AdmissionPolicyState.objects.select_for_update(of=("self",))
        .filter(cluster=cluster)
        .select_related("qos_policy")
    )
    return {r.pool_id: r for r in rows if r.pool_id}, [r for r in rows if not r.pool_id]


@transaction.atomic
def _record_not_applicable(cluster: Cluster, desired: dict[int, DesiredAdmission], now) -> None:
    by_pool, orphans = _rows(cluster)
    for pool_id, item in desired.items():
        values = {**_row_values(item), "manifest": "", "manifest_hash": "", "state": AdmissionState.NOT_APPLICABLE}
        _save(by_pool.pop(pool_id, None), cluster, item.pool, {**values, "error": "", "error_at": None})
    AdmissionPolicyState.objects.filter(pk__in=[r.pk for r in [*by_pool.values(), *orphans]]).delete()


@transaction.atomic
def _record_unreachable(cluster: Cluster, desired: dict[int, DesiredAdmission], error: str, now) -> None:
    """The API refused or was unreachable before anything was compared: every row says why; nothing is deleted."""
    by_pool, orphans = _rows(cluster)
    for pool_id, item in desired.items():
        row = by_pool.pop(pool_id, None)
        text = item.error or error
        error_at = row.error_at if row is not None and row.error == text and row.error_at else now
        values = {**_row_values(item), "state": AdmissionState.ERROR, "error": text, "error_at": error_at}
        _save(row, cluster, item.pool, values)
    for row in [*by_pool.values(), *orphans]:
        error_at = row.error_at if row.error == error and row.error_at else now
        _save(row, cluster, row.pool, {"state": AdmissionState.REMOVING, "error": error, "error_at": error_at})


@transaction.atomic
def _record(
    cluster: Cluster, desired: dict[int, DesiredAdmission], outcomes: list[Outcome], now, result: SyncResult
) -> None:
    by_name = {o.name: o for o in outcomes}
    by_pool, orphans = _rows(cluster)
    for pool_id, item in desired.items():
        row = by_pool.pop(pool_id, None)
        outcome = by_name.get(item.name)
        values = {**_row_values(item), "checked_at": now}
        error = item.error or (outcome.error if outcome else "")
        if error:
            error_at = row.error_at if row is not None and row.error == error and row.error_at else now
            values.update(state=AdmissionState.ERROR, error=error, error_at=error_at)
            result.errors += 1
        else:
            first_seen = row is None or row.manifest_hash != item.manifest_hash or row.state != AdmissionState.APPLIED
            applied_at = now if outcome.actions or first_seen or row.applied_at is None else row.applied_at
            values.update(
                state=AdmissionState.APPLIED,
                error="",
                error_at=None,
                applied_at=applied_at,
                resource_versions=outcome.resource_versions,
            )
        _save(row, cluster, item.pool, values)
        if outcome is not None:
            _audit(cluster, outcome, item=item, result=result)
    wanted_names = {item.name for item in desired.values()}
    for row in [*by_pool.values(), *orphans]:
        outcome = by_name.get(row.object_name) if row.object_name not in wanted_names else None
        if outcome is not None and outcome.error:
            error_at = row.error_at if row.error == outcome.error and row.error_at else now
            values = {"state": AdmissionState.REMOVING, "error": outcome.error, "error_at": error_at, "checked_at": now}
            _save(row, cluster, row.pool, values)
            result.errors += 1
        else:
            row.delete()
    for outcome in outcomes:
        if outcome.name not in wanted_names:
            _audit(cluster, outcome, item=None, result=result)


def _audit(cluster: Cluster, outcome: Outcome, *, item: DesiredAdmission | None, result: SyncResult) -> None:
    """One audit event per object written or deleted, on the cluster (rows come and go; the cluster stays)."""
    for kind, action in outcome.actions:
        setattr(result, action, getattr(result, action) + 1)
        what = {"kind": "ValidatingAdmissionPolicy" if kind == "policy" else "ValidatingAdmissionPolicyBinding"}
        what["name"] = outcome.name
        if item is not None:
            what.update(pool=item.pool.name, qos_policy=item.policy.name, manifest_hash=item.manifest_hash)
        audit_record(
            actor=ACTOR,
            action=f"admission.{AUDIT_VERBS[action]}",
            obj=cluster,
            before=None if action == "created" else {"name": outcome.name},
            after=None if action == "deleted" else what,
            message=f"{what['kind']} {outcome.name} {action}",
        )
        log.info("cluster %s: %s %s %s", cluster.name, what["kind"], outcome.name, action)


# --- selectors ----------------------------------------------------------------------------------------------------


def admission_states():
    """Every recorded row with its cluster, pool and QoS policy (for lists and the API)."""
    return AdmissionPolicyState.objects.select_related("cluster", "pool", "qos_policy").order_by(
        "cluster__name", "pool_name", "pk"
    )


def clusters_to_sync(*, at=None) -> list[int]:
    """Clusters with a pool enforcing at admission now, or with recorded state (objects that may need deleting)."""
    enforcing = {d.pool.cluster_id for d in desired_admissions(NodePool.objects.all(), at=at).values()}
    recorded = set(AdmissionPolicyState.objects.values_list("cluster_id", flat=True).distinct())
    return sorted(enforcing | recorded)


def clusters_out_of_date(*, at=None) -> list[int]:
    """Clusters where what is wanted differs from what was last recorded (a policy, window, pool or selector
    changed): the reconcile tick syncs those at once, the periodic pass catches everything else."""
    desired = desired_admissions(NodePool.objects.select_related("cluster"), at=at)
    rows = AdmissionPolicyState.objects.values("pool_id", "cluster_id", "object_name", "manifest_hash", "state")
    by_pool = {r["pool_id"]: r for r in rows if r["pool_id"]}
    stale = {r["cluster_id"] for r in rows if not r["pool_id"] and r["state"] != AdmissionState.REMOVING}
    for pool_id, item in desired.items():
        row = by_pool.pop(pool_id, None)
        recorded_hash = row and row["state"] != AdmissionState.NOT_APPLICABLE and row["manifest_hash"]
        wanted_hash = item.pool.cluster.driver != ClusterDriver.AGENT and item.manifest_hash
        if row is None or row["object_name"] != item.name or (recorded_hash or "") != (wanted_hash or ""):
            stale.add(item.pool.cluster_id)
    stale |= {r["cluster_id"] for r in by_pool.values() if r["state"] != AdmissionState.REMOVING}
    return sorted(stale)


@dataclass(frozen=True)
class AdmissionView:
    """One pool's admission enforcement as a page shows it: wanted now, its recorded row, and the status word."""

    pool: NodePool
    desired: DesiredAdmission | None
    row: AdmissionPolicyState | None

    @property
    def status(self) -> str:
        """applied | error | pending | not_applicable | removing."""
        if self.pool.cluster.driver == ClusterDriver.AGENT:
            return AdmissionState.NOT_APPLICABLE
        if self.desired is None:
            return AdmissionState.REMOVING if self.row is not None else ""
        if self.desired.error:
            return AdmissionState.ERROR
        row = self.row
        if row is None or (row.object_name, row.manifest_hash) != (self.desired.name, self.desired.manifest_hash):
            return "pending"
        return row.state

    @property
    def name(self) -> str:
        """The ValidatingAdmissionPolicy's name, which its binding shares."""
        return self.desired.name if self.desired else (self.row.object_name if self.row else "")

    @property
    def manifest(self) -> str:
        return self.desired.manifest if self.desired else (self.row.manifest if self.row else "")

    @property
    def error(self) -> str:
        if self.desired is not None and self.desired.error:
            return self.desired.error
        return self.row.error if self.row is not None else ""


def pool_admission_views(pools) -> list[AdmissionView]:
    """Admission enforcement of these pools (wanted now or still recorded), in the pools' order; a few queries."""
    pools = list(pools)
    desired = desired_admissions(pools)
    rows = {
        r.pool_id: r
        for r in AdmissionPolicyState.objects.filter(pool__in=[p.pk for p in pools]).select_related("qos_policy")
    }
    return [
        AdmissionView(pool, desired.get(pool.pk), rows.get(pool.pk))
        for pool in pools
        if pool.pk in desired or pool.pk in rows
    ]


def policy_admission_views(policy: QoSPolicy) -> list[AdmissionView]:
    """Admission enforcement of every pool that has `policy` in force now or a recorded row of it."""
    states = pool_states(NodePool.objects.values_list("pk", flat=True))
    in_force = {pool_id for pool_id, state in states.items() if state.qos_policy and state.qos_policy.pk == policy.pk}
    recorded = AdmissionPolicyState.objects.filter(qos_policy=policy, pool__isnull=False).values_list("pool_id")
    pools = NodePool.objects.filter(Q(pk__in=in_force) | Q(pk__in=recorded)).select_related("cluster")
    return [v for v in pool_admission_views(pools.order_by("cluster__name", "name")) if _about(v, policy)]


def _about(view: AdmissionView, policy: QoSPolicy) -> bool:
    if view.desired is not None:
        return view.desired.policy.pk == policy.pk
    return view.row is not None and view.row.qos_policy_id == policy.pk
