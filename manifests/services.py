"""A whole desired state, given as documents, planned against the server and applied in one transaction, in
dependency order, through the services the UI and API use (each validates, and sends the desired-state signal the
reconcile loop follows). Refused when an object changed since the plan was made; recorded as one audit event."""

from dataclasses import dataclass, field, replace
from datetime import date, time

from django.db import transaction
from django.utils import timezone
from jsonschema import Draft202012Validator

from core.audit import Actor, audit_batch, audit_collected
from core.exceptions import ApplicationError
from fleet.models import Cluster, Node, NodePool
from manifests import documents
from manifests.documents import KINDS, KUEUE, POOL, PROFILE, QOS, SCHEDULE
from scheduling import kueue as kueue_services
from scheduling import services as schedule_services
from scheduling.kueue import pool_nodes, quota_steps
from scheduling.models import KueueBinding, Schedule
from scheduling.pools import KEEP, PoolSettings, pool_remove, pool_save
from scheduling.quota import QuotaChange
from scheduling.selectors import ScheduleChange, pool_impact
from sharing import services as sharing_services
from sharing.models import QoSPolicy, SharingProfile

MAX_DOCUMENTS = 20_000


@dataclass(frozen=True)
class FieldChange:
    field: str
    before: object
    after: object


@dataclass(frozen=True)
class Change:
    """One object the plan creates, updates or deletes; `document` is its index in the request (None: pruned)."""

    action: str
    key: str
    kind: str
    document: int | None
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True)
class PoolImpact:
    """What the plan makes a pool's nodes do, as the schedule and profile previews say it: at once and at the next
    scheduled switch; with a Kueue binding, each moment's quota before → after."""

    pool: NodePool
    changes: list[ScheduleChange]
    quota: list[list[QuotaChange]]


@dataclass
class Plan:
    changes: list[Change]
    versions: dict[str, str | None]
    impact: list[PoolImpact] = field(default_factory=list)
    applied: bool = False
    audit_event: int | None = None


class _DryRun(Exception):
    """Rolls back a plan carried out only to check it and read its impact."""


def _path(parts) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _schema_errors(docs: list) -> dict[str, list[str]]:
    """JSON Schema errors per document path (`documents[3].windows[0].start`); an unknown field is named at its
    own path, so the client can point at its line."""
    validator = Draft202012Validator(documents.schema())
    errors: dict[str, list[str]] = {}
    for i, doc in enumerate(docs):
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
            if error.validator == "additionalProperties" and isinstance(error.instance, dict):
                known = error.schema.get("properties", {})
                for name in [k for k in error.instance if k not in known]:
                    where = f"documents[{i}]{_path([*error.absolute_path, name])}"
                    errors.setdefault(where, []).append(f"Unknown field {name!r}.")
                continue
            if error.validator in ("if", "allOf"):
                continue  # the branch's own errors are reported
            errors.setdefault(f"documents[{i}]{_path(error.absolute_path)}", []).append(error.message)
    return errors


def _refuse(errors: dict[str, list[str]], what: str = "The documents are not valid") -> None:
    if errors:
        where, messages = next(iter(errors.items()))
        raise ApplicationError(f"{what}: {where}: {messages[0]}", errors=errors)


def _reference_errors(desired: dict[str, tuple[int, dict]], current: dict[str, dict], prune: bool) -> dict:
    """Names a document uses that will not exist once the plan is applied: profiles, QoS policies, pools,
    clusters (registered on the server, never defined by documents) and, for explicit pools, nodes."""
    kept = {} if prune else current

    def names(kind, *parts) -> set:
        docs = [d for _, d in desired.values()] + list(kept.values())
        return {tuple(d[p] for p in parts) for d in docs if d["kind"] == kind}

    profiles, policies = names("Profile", "name"), names("QoSPolicy", "name")
    pools = names("Pool", "cluster", "name")
    clusters = set(Cluster.objects.values_list("name", flat=True))
    gone = "" if not prune else " (--prune removes what the files do not name)"
    errors: dict[str, list[str]] = {}

    def check(i, where, value, known, what):
        if value is not None and (value,) not in known:
            errors.setdefault(f"documents[{i}]{where}", []).append(f"No {what} named {value!r} in the files{gone}.")

    for i, doc in desired.values():
        if doc["kind"] in ("Pool", "Schedule", "KueueBinding") and doc["cluster"] not in clusters:
            errors.setdefault(f"documents[{i}].cluster", []).append(
                f"No cluster named {doc['cluster']!r} on the server (register clusters before applying)."
            )
        if doc["kind"] == "Pool":
            check(i, ".profile", doc["profile"], profiles, "profile")
            check(i, ".qos_policy", doc["qos_policy"], policies, "QoS policy")
            if doc["members"]:
                if doc["node_selector"]:
                    errors.setdefault(f"documents[{i}].members", []).append(
                        "A pool with a node selector takes no members: its selector picks them."
                    )
                live = set(Node.objects.live().filter(cluster__name=doc["cluster"]).values_list("name", flat=True))
                for name in [n for n in doc["members"] if n not in live]:
                    errors.setdefault(f"documents[{i}].members", []).append(
                        f"No live node named {name!r} in cluster {doc['cluster']!r}."
                    )
        elif doc["kind"] in ("Schedule", "KueueBinding") and (doc["cluster"], doc["pool"]) not in pools:
            errors.setdefault(f"documents[{i}].pool", []).append(
                f"No pool named {doc['pool']!r} in cluster {doc['cluster']!r} in the files{gone}."
            )
        if doc["kind"] == "Schedule":
            check(i, ".baseline_profile", doc["baseline_profile"], profiles, "profile")
            check(i, ".baseline_qos_policy", doc["baseline_qos_policy"], policies, "QoS policy")
            for w, window in enumerate(doc["windows"]):
                check(i, f".windows[{w}].profile", window["profile"], profiles, "profile")
                check(i, f".windows[{w}].qos_policy", window["qos_policy"], policies, "QoS policy")
    return errors


def _field_changes(kind, before: dict | None, after: dict | None) -> tuple[FieldChange, ...]:
    names = [f for f in kind.fields if f not in kind.identity]
    before, after = before or {}, after or {}
    return tuple(FieldChange(f, before.get(f), after.get(f)) for f in names if before.get(f) != after.get(f))


def plan(docs: list, *, prune: bool = False) -> tuple[Plan, dict]:
    """The changes that would make the server match `docs` (and, with `prune`, delete what they do not name) and
    the version of every object in scope; refused (400, errors per document path) when a document is invalid,
    named twice, or names what will not exist. Also returns the documents by key, normalised (as (index, doc))."""
    if len(docs) > MAX_DOCUMENTS:
        raise ApplicationError(f"At most {MAX_DOCUMENTS} documents in one plan.", errors={"documents": ["Too many."]})
    _refuse(_schema_errors(docs))
    desired: dict[str, tuple[int, dict]] = {}
    errors: dict[str, list[str]] = {}
    for i, doc in enumerate(docs):
        full = documents.normalised(doc)
        key = KINDS[full["kind"]].key(full)
        if key in desired:
            errors.setdefault(f"documents[{i}]", []).append(
                f"{key} is named twice (also documents[{desired[key][0]}])."
            )
        desired[key] = (i, full)
    current = documents.current()
    errors.update(_reference_errors(desired, current, prune))
    _refuse(errors)
    changes = []
    for key in sorted(desired, key=documents.sort_key):
        i, doc = desired[key]
        kind = KINDS[doc["kind"]]
        if key not in current:
            changes.append(Change("create", key, kind.name, i, _field_changes(kind, None, kind.minimal(doc))))
        elif current[key] != doc:
            changes.append(Change("update", key, kind.name, i, _field_changes(kind, current[key], doc)))
    scope = set(desired)
    if prune:
        gone = sorted(set(current) - set(desired), key=documents.sort_key, reverse=True)
        changes += [Change("delete", key, current[key]["kind"], None) for key in gone]
        scope |= set(current)
    versions = {key: documents.version(current[key]) if key in current else None for key in sorted(scope)}
    return Plan(changes, versions), desired


def plan_apply(
    *, actor: Actor, docs: list, prune: bool = False, dry_run: bool = True, versions: dict | None = None, message=""
) -> Plan:
    """Plan `docs` and carry the plan out in one transaction; with `dry_run` everything is rolled back once the
    impact is read (the same checks, nothing kept). With `versions` (a plan's), refused with 409 naming every
    object whose version differs now: someone changed it on the server since that plan was made."""
    with transaction.atomic():
        result, desired = plan(docs, prune=prune)
        if versions is not None:
            stale = sorted(k for k in set(result.versions) | set(versions) if result.versions.get(k) != versions.get(k))
            if stale:
                named = ", ".join(stale[:10]) + (f" and {len(stale) - 10} more" if len(stale) > 10 else "")
                raise ApplicationError(
                    f"Changed on the server since the plan was made: {named}. Plan again and review.",
                    errors={"versions": [f"{key}: changed since the plan was made." for key in stale]},
                    status=409,
                )
        try:
            with transaction.atomic(), audit_collected() as events:
                # The impact is the plan's (a dry run): an apply answers what it changed, and the reconcile loop
                # turns that into rollouts.
                before = (
                    {p.pk: pool_nodes(p, at=timezone.now()) for p in _affected_pools(result.changes)} if dry_run else {}
                )
                for change in result.changes:
                    _carry_out(actor, change, desired.get(change.key, (None, None))[1])
                if dry_run or not result.changes:
                    result.impact = _impact(result.changes, before)
                    raise _DryRun
        except _DryRun:
            return result
        event = audit_batch(actor=actor, action="config.apply", label=_summary(result.changes), events=events,
                            message=message)  # fmt: skip
        result.applied, result.audit_event = True, event.pk
        return result


def _summary(changes: list[Change]) -> str:
    counts = {a: sum(c.action == a for c in changes) for a in ("create", "update", "delete")}
    return "config: " + ", ".join(f"{n} {a}d" for a, n in counts.items() if n)


def _carry_out(actor: Actor, change: Change, doc: dict | None) -> None:
    """One change through its kind's services; a refusal names the document (or the pruned object) it is about."""
    try:
        if change.action == "delete":
            _delete(actor, change.key, documents.current_object(change.key))
        else:
            STEPS[change.kind](actor, doc)
    except ApplicationError as exc:
        where = f"documents[{change.document}]" if change.document is not None else "prune"
        errors = {f"{where}.{f}" if change.document is not None else where: m for f, m in exc.errors.items()}
        raise ApplicationError(f"{change.key}: {exc.message}", errors=errors or {where: [exc.message]},
                               status=exc.status) from exc  # fmt: skip


def _profile(name):
    return SharingProfile.objects.get(name=name) if name else None


def _policy(name):
    return QoSPolicy.objects.get(name=name) if name else None


def _pool(doc: dict) -> NodePool:
    return NodePool.objects.select_related("cluster").get(cluster__name=doc["cluster"], name=doc["pool"])


def _values(kind, doc: dict, names) -> dict:
    return {f: doc[f] for f in names if f in kind.fields}


def _apply_named(actor: Actor, doc: dict, *, kind, model, fields, create, update, keyword: str) -> None:
    """A QoS policy or a profile: created, or updated in place, by its service."""
    values = _values(kind, doc, fields)
    current = model.objects.filter(name=doc["name"]).first()
    if current is None:
        create(actor=actor, **values)
    else:
        update(actor=actor, **{keyword: current}, **values)


def _apply_qos(actor: Actor, doc: dict) -> None:
    _apply_named(actor, doc, kind=QOS, model=QoSPolicy, fields=sharing_services.QOS_FIELDS, keyword="policy",
                 create=sharing_services.qos_policy_create, update=sharing_services.qos_policy_update)  # fmt: skip


def _apply_profile(actor: Actor, doc: dict) -> None:
    _apply_named(actor, doc, kind=PROFILE, model=SharingProfile, fields=sharing_services.PROFILE_FIELDS,
                 keyword="profile", create=sharing_services.profile_create,
                 update=sharing_services.profile_update)  # fmt: skip


def _apply_pool(actor: Actor, doc: dict) -> None:
    cluster = Cluster.objects.get(name=doc["cluster"])
    members = None
    if not doc["node_selector"]:
        members = tuple(Node.objects.live().filter(cluster=cluster, name__in=doc["members"]))
    settings = PoolSettings(
        name=doc["name"],
        description=doc["description"],
        node_selector=doc["node_selector"],
        members=members,
        profile=_profile(doc["profile"]),
        qos_policy=_policy(doc["qos_policy"]),
        schedule=KEEP,
    )
    pool = NodePool.objects.filter(cluster=cluster, name=doc["name"]).first()
    pool_save(actor=actor, settings=settings, pool=pool, cluster=cluster)


def _apply_schedule(actor: Actor, doc: dict) -> None:
    pool = _pool(doc)
    windows = [
        {
            "name": w["name"],
            "weekdays": w["weekdays"],
            "start": time.fromisoformat(w["start"]),
            "end": time.fromisoformat(w["end"]),
            "profile": _profile(w["profile"]),
            "qos_policy": _policy(w["qos_policy"]),
        }
        for w in doc["windows"]
    ]
    exceptions = [{"date": date.fromisoformat(e["date"]), "note": e["note"]} for e in doc["exceptions"]]
    values = {
        **_values(SCHEDULE, doc, schedule_services.SCHEDULE_FIELDS),
        "baseline_profile": _profile(doc["baseline_profile"]),
        "baseline_qos_policy": _policy(doc["baseline_qos_policy"]),
    }
    schedule = Schedule.objects.filter(pool=pool).first()
    if schedule is None:
        schedule_services.schedule_create(actor=actor, pool=pool, windows=windows, exceptions=exceptions, **values)
    else:
        schedule_services.schedule_update(
            actor=actor, schedule=schedule, windows=windows, exceptions=exceptions, **values
        )


def _apply_kueue(actor: Actor, doc: dict) -> None:
    kueue_services.kueue_binding_set(
        actor=actor,
        pool=_pool(doc),
        cluster_queues=doc["cluster_queues"],
        enabled=doc["enabled"],
        lead_minutes=doc["lead_minutes"],
    )


STEPS = {
    QOS.name: _apply_qos,
    PROFILE.name: _apply_profile,
    POOL.name: _apply_pool,
    SCHEDULE.name: _apply_schedule,
    KUEUE.name: _apply_kueue,
}


def _delete(actor: Actor, key: str, obj) -> None:
    if isinstance(obj, QoSPolicy):
        sharing_services.qos_policy_delete(actor=actor, policy=obj)
    elif isinstance(obj, SharingProfile):
        sharing_services.profile_delete(actor=actor, profile=obj)
    elif isinstance(obj, NodePool):
        pool_remove(actor=actor, pool=obj)
    elif isinstance(obj, Schedule):
        schedule_services.schedule_delete(actor=actor, schedule=obj)
    elif isinstance(obj, KueueBinding):
        kueue_services.kueue_binding_delete(actor=actor, binding=obj)


def _affected_pools(changes: list[Change]) -> list[NodePool]:
    """Pools whose desired state the changes touch: their own documents, their schedule's or binding's, and those
    using a changed profile or QoS policy (as default, in a window or as a baseline)."""
    named: set[tuple[str, str]] = set()
    profiles, policies = set(), set()
    for change in changes:
        if change.action == "delete":
            continue
        parts = change.key.split("/", 2)
        if change.kind in (POOL.name, SCHEDULE.name, KUEUE.name):
            named.add((parts[1], parts[2]))
        elif change.kind == PROFILE.name and change.action == "update":
            profiles.add(parts[1])
        elif change.kind == QOS.name and change.action == "update":
            policies.add(parts[1])
    everything = NodePool.objects.select_related("cluster")
    pools = {(p.cluster.name, p.name): p for p in everything if (p.cluster.name, p.name) in named}
    if profiles or policies:
        users = NodePool.objects.select_related("cluster").filter(
            sharing__profile__name__in=profiles
        ) | NodePool.objects.select_related("cluster").filter(schedule__windows__profile__name__in=profiles)
        users = users | NodePool.objects.filter(schedule__baseline_profile__name__in=profiles)
        users = users | NodePool.objects.filter(sharing__qos_policy__name__in=policies)
        users = users | NodePool.objects.filter(schedule__windows__qos_policy__name__in=policies)
        for pool in users.distinct().select_related("cluster"):
            pools[(pool.cluster.name, pool.name)] = pool
    return [pools[key] for key in sorted(pools)]


def _impact(changes: list[Change], before: dict[int, list]) -> list[PoolImpact]:
    """Each affected pool's impact read once the plan is carried out; its Kueue quota from the nodes' desired
    state `before` it was (pool_nodes per pool id; a new pool's nodes as they report)."""
    result = []
    for pool in _affected_pools(changes):
        moments = pool_impact(pool)
        quota = [[] for _ in moments]
        if KueueBinding.objects.filter(pool=pool, enabled=True).exists():
            nodes = before.get(pool.pk) or [replace(n, now=None) for n in pool_nodes(pool, at=timezone.now())]
            quota = quota_steps(pool, nodes, [moment.profile for moment in moments])
        result.append(PoolImpact(pool, moments, quota))
    return result
