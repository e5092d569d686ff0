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
from dataclasses import dataclass, field
from functools import partial

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.choices import ClusterDriver
from fleet.labels import parse_selector
from fleet.models import Cluster, NodePool
from scheduling.selectors import pool_states
from sharing.models import QoSPolicy
from sharing.render import render_admission_manifests, render_admission_policy
from worker.drivers.base import DriverError
from worker.drivers.kubernetes.admission import AdmissionPolicies, Outcome, Wanted
from worker.locks import ADMISSION, ClusterLock
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
BUSY = "another admission sync of this cluster is running; the next tick or sweep tries again"
OBJECTS_LEFT = (
    "Cluster {cluster} still has admission policies in its API server that deny GPU pods ({objects}). Switch "
    "admission enforcement off in their QoS policies or detach the policies from the pools, and wait for the next "
    "sync to remove them (the pools' compliance pages show Removing until it has); then {action}. If its API server "
    "is gone for good, an admin can forget them (POST /api/v1/admission-policies/<id>/forget/) and delete them there "
    "by hand should it come back."
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


def desired_admissions(pools, *, at=None, states=None, render_only=None) -> dict[int, DesiredAdmission]:
    """Pool id -> what it should enforce at `at` (default now), for the pools whose QoS policy in force has
    `enforce_admission`. Names are unique per cluster when `pools` holds all of its pools: pools whose names would
    collide get `--<id>` appended, which no natural name has (slugs never hold two hyphens in a row). `states`: the
    pools' states when the caller has them; `render_only`: the pool ids whose manifests are wanted (a page shows a
    few; every pool is still named, so suffixes stay those of the sync)."""
    pools = list(pools)
    states = states if states is not None else pool_states([p.pk for p in pools], at=at)
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
        if render_only is not None and pool.pk not in render_only:
            continue
        if seen[(pool.cluster_id, name)] > 1:
            name = f"{name[: NAME_LIMIT - 12].rstrip('-')}--{pool.pk}"
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
    outcome per pool and audit every write as it happens. Never raises for the cluster's own errors: they are
    recorded. One pass per cluster at a time: a pass that finds another one running returns at once, saying so
    (two interleaved passes could undo each other's writes)."""
    lock = ClusterLock(cluster.pk, ADMISSION)
    if not lock.acquire():
        log.info("cluster %s: %s", cluster.name, BUSY)
        return SyncResult(cluster.name, skipped=BUSY)
    try:
        return _sync(cluster, now or timezone.now())
    finally:
        lock.release()


def _sync(cluster: Cluster, now) -> SyncResult:
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
    wanted = {item.name: item for item in desired.values() if item.wanted}
    pass_ = _Pass(cluster, desired, wanted, now, result)
    policies.sync([item.wanted for item in wanted.values()], observed, partial(_record_outcome, pass_))
    _record_rest(pass_, observed)
    return result


@dataclass
class _Pass:
    """What recording one pass needs, pair after pair: rows kept `removing` and pairs deleted so far."""

    cluster: Cluster
    desired: dict[int, DesiredAdmission]
    wanted: dict[str, DesiredAdmission]
    now: object
    result: SyncResult
    kept: set[int] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)


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


def _since(row: AdmissionPolicyState | None, error: str, now):
    """When the row's error started: kept while the error stays the same."""
    return row.error_at if row is not None and row.error == error and row.error_at else now


@transaction.atomic
def _record_outcome(pass_: _Pass, outcome: Outcome) -> None:
    """One pair's outcome, as soon as the driver is done with it: the pool's row (or the rows of pools that no longer
    want it) and one audit event per write, so a pass cut short has recorded every write it made."""
    cluster, now, item = pass_.cluster, pass_.now, pass_.wanted.get(outcome.name)
    if outcome.error:
        pass_.result.errors += 1
    if item is not None:
        row = AdmissionPolicyState.objects.select_for_update().filter(cluster=cluster, pool=item.pool).first()
        values = {**_row_values(item), "checked_at": now}
        if outcome.error:
            # What was written before the error is live: its resourceVersion says the pair may exist.
            versions = {**(row.resource_versions if row is not None else {}), **outcome.resource_versions}
            values.update(
                state=AdmissionState.ERROR,
                error=outcome.error,
                error_at=_since(row, outcome.error, now),
                resource_versions=versions,
            )
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
    else:
        if not outcome.error:
            pass_.deleted.add(outcome.name)
        rows = (
            AdmissionPolicyState.objects.select_for_update()
            .filter(cluster=cluster, object_name=outcome.name)
            .exclude(pool_id__in=list(pass_.desired))
        )
        for row in rows:
            if outcome.error:
                values = {
                    "state": AdmissionState.REMOVING,
                    "error": outcome.error,
                    "error_at": _since(row, outcome.error, now),
                    "checked_at": now,
                }
                _save(row, cluster, None, values)
                pass_.kept.add(row.pk)
            else:
                row.delete()
    _audit(cluster, outcome, item=item, result=pass_.result)


@transaction.atomic
def _record_rest(pass_: _Pass, observed: dict[str, dict]) -> None:
    """After a complete pass: pools whose policy cannot be rendered say why, and rows of pools that no longer enforce
    go unless their objects could not be deleted (an incomplete pass never gets here: it deletes no row)."""
    cluster, now = pass_.cluster, pass_.now
    live = set(observed) - pass_.deleted
    by_pool, orphans = _rows(cluster)
    for pool_id, item in pass_.desired.items():
        row = by_pool.pop(pool_id, None)
        if not item.error:
            continue  # recorded with its outcome
        values = {**_row_values(item), "checked_at": now}
        values.update(state=AdmissionState.ERROR, error=item.error, error_at=_since(row, item.error, now))
        if item.name not in live and (row is None or row.object_name not in live):
            values.update(applied_at=None, resource_versions={})  # nothing of it is left in the cluster
        _save(row, cluster, item.pool, values)
        pass_.result.errors += 1
    gone = [row.pk for row in [*by_pool.values(), *orphans] if row.pk not in pass_.kept]
    AdmissionPolicyState.objects.filter(pk__in=gone).delete()


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


def pool_admission_views(pools, *, states=None) -> list[AdmissionView]:
    """Admission enforcement of these pools (wanted now or still recorded), in the pools' order; a few queries.
    Object names are worked out over every pool of their clusters, as the sync does (colliding names get suffixes);
    `states`, when the caller has them, must cover those clusters' pools."""
    pools = list(pools)
    clusters = {pool.cluster_id for pool in pools}
    desired = desired_admissions(
        NodePool.objects.filter(cluster_id__in=clusters).select_related("cluster"),
        states=states,
        render_only={pool.pk for pool in pools},
    )
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
    views = pool_admission_views(pools.order_by("cluster__name", "name"), states=states)
    return [v for v in views if _about(v, policy)]


def _about(view: AdmissionView, policy: QoSPolicy) -> bool:
    if view.desired is not None:
        return view.desired.policy.pk == policy.pk
    return view.row is not None and view.row.qos_policy_id == policy.pk


# --- guards: Tessera's objects never outlive their rows -------------------------------------------------------------


def admission_objects_left(cluster: Cluster) -> list[AdmissionPolicyState]:
    """The cluster's rows whose policy and binding may still be in its API server: applied, being removed, or in
    error after they had been written."""
    rows = AdmissionPolicyState.objects.filter(cluster=cluster).exclude(state=AdmissionState.NOT_APPLICABLE)
    return [
        row
        for row in rows.order_by("object_name")
        if row.state != AdmissionState.ERROR or row.applied_at is not None or row.resource_versions
    ]


@transaction.atomic
def admission_state_forget(*, actor: Actor, state: AdmissionPolicyState) -> None:
    """Drop a row without touching its cluster: the way out when the API server is gone for good, so the cluster can
    be deleted or switched. Whatever was applied there stays until removed by hand; the audit event names it."""
    before = {
        "pool": state.pool_name,
        "qos_policy": state.policy_name,
        "name": state.object_name,
        "state": state.state,
        "manifest_hash": state.manifest_hash,
    }
    audit_record(
        actor=actor,
        action="admission.forget",
        obj=state.cluster,
        before=before,
        message=f"forgot {state.object_name} for pool {state.pool_name}: left in the cluster, if it is there",
    )
    state.delete()


def cluster_check_no_admission_objects(*, cluster: Cluster, action: str) -> None:
    """Refuse (409) what would drop the cluster's rows while its admission objects may still deny pods there: the
    sync could then never delete them."""
    rows = admission_objects_left(cluster)
    if rows:
        objects = ", ".join(f"{row.object_name} for pool {row.pool_name}" for row in rows)
        raise ApplicationError(OBJECTS_LEFT.format(cluster=cluster.name, objects=objects, action=action), status=409)


def cluster_pre_save(sender, instance: Cluster, raw=False, update_fields=None, **kwargs):
    """Receiver (fleet.Cluster pre_save): no switch from the kubernetes driver while admission objects are left."""
    if raw or instance.pk is None or instance.driver == ClusterDriver.KUBERNETES:
        return
    if update_fields is not None and "driver" not in update_fields:
        return
    stored = Cluster.objects.filter(pk=instance.pk).values_list("driver", flat=True).first()
    if stored == ClusterDriver.KUBERNETES:
        cluster_check_no_admission_objects(cluster=instance, action="switch its driver")


def cluster_pre_delete(sender, instance: Cluster, **kwargs):
    """Receiver (fleet.Cluster pre_delete): no delete while admission objects are left in its API server."""
    cluster_check_no_admission_objects(cluster=instance, action="delete it")
