"""Writes of desired sharing state: profiles, pool defaults and node pins — validated, audited, atomic."""

from dataclasses import asdict

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import ProtectedError, Q
from django.utils import timezone

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.models import Gpu, Node, NodePool
from sharing.mig import GpuProduct
from sharing.models import NodePin, PoolSharing, QoSComplianceReport, QoSPolicy, SharingProfile
from sharing.nvidia_import import ProposedProfile
from sharing.qos import BOARD_RANGE_FIELDS, board_range_errors, check_pods, consistency_errors, parse_taint
from sharing.selectors import (
    ImportPreview,
    pool_pod_views,
    profiles_under_pool_policy,
    refuse_under_cluster_strategies,
)
from sharing.signals import desired_state_changed
from sharing.spec import ProfileSpec, catalog_product, node_validation_errors, validate_spec

PROFILE_FIELDS = (
    "name",
    "description",
    "mode",
    "target_products",
    "mig_layouts",
    "mig_strategy",
    "replicas",
    "mps_active_thread_percentage",
    "mps_pinned_memory_limit_mib",
    "rename_shared",
    "fail_requests_greater_than_one",
    "time_slice_interval",
)


def profile_snapshot(profile: SharingProfile) -> dict:
    """The profile's fields as JSON, for audit before/after."""
    return {f: getattr(profile, f) for f in PROFILE_FIELDS}


def _refuse(what: str, errors: dict[str, list[str]]) -> None:
    """Raise the one domain error for invalid input; its message names the first field and its first complaint."""
    if errors:
        field, messages = next(iter(errors.items()))
        raise ApplicationError(f"The {what} is not valid: {field.replace('_', ' ')}: {messages[0]}", errors=errors)


def _check(profile: SharingProfile) -> None:
    errors: dict[str, list[str]] = {}
    try:
        profile.full_clean(exclude=["created_by"])
    except ValidationError as exc:
        errors.update(exc.message_dict)
    errors.update(validate_spec(profile.to_spec()))  # NVIDIA's words over the model's generic "cannot be blank"
    _refuse("profile", errors)


@transaction.atomic
def profile_create(*, actor: Actor, **values) -> SharingProfile:
    """Create a profile that NVIDIA's rules accept for every product it targets."""
    profile = SharingProfile(**{k: v for k, v in values.items() if k in PROFILE_FIELDS})
    profile.created_by = actor.user if getattr(actor.user, "pk", None) else None
    _check(profile)
    profile.save()
    audit_record(actor=actor, action="profile.create", obj=profile, after=profile_snapshot(profile))
    return profile


@transaction.atomic
def profile_update(*, actor: Actor, profile: SharingProfile, **values) -> SharingProfile:
    """Change a profile; nodes using it are re-evaluated by the reconcile loop, never here."""
    profile = SharingProfile.objects.select_for_update().get(pk=profile.pk)
    before = profile_snapshot(profile)
    for key in PROFILE_FIELDS:
        if key in values:
            setattr(profile, key, values[key])
    _check(profile)
    if profile_snapshot(profile) == before:
        return profile
    if profile.imported and _meaning(profile_snapshot(profile)) != _meaning(before):
        profile.imported = {}  # the imported names no longer hold what the profile means: render its own
    _check_assignments_still_fit(profile)
    profile.save()
    audit_record(actor=actor, action="profile.update", obj=profile, before=before, after=profile_snapshot(profile))
    desired_state_changed.send(sender=SharingProfile)
    return profile


@transaction.atomic
def profiles_import(*, actor: Actor, preview: ImportPreview, names: list[str] | None = None) -> list[SharingProfile]:
    """Create the profiles an import preview proposes (all it can create, or those `names`), each keeping the names
    of the cluster's configs it came from (sharing.spec.KeptConfigs): nodes running them stay as they are once the
    profile is their pool's default. Refuses names the preview refused or that exist already; audited per profile."""
    creatable = {p.name: p for p in preview.creatable}
    wanted = list(creatable) if names is None else list(dict.fromkeys(names))
    unknown = [name for name in wanted if name not in creatable]
    if unknown:
        reasons = {p.name: p.refusal for p in preview.plan.profiles if p.refusal}
        raise ApplicationError(
            f"Cannot import {', '.join(unknown[:5])}: refused, already a profile, or not proposed.",
            errors={"names": [f"{n}: {reasons.get(n) or 'exists already or not proposed'}" for n in unknown[:10]]},
        )
    if not wanted:
        raise ApplicationError("Nothing to import: every proposed profile exists already or was refused.")
    created = []
    for name in wanted:
        proposed = creatable[name]
        spec = proposed.spec
        profile = SharingProfile(
            name=name,
            description=f"Imported from cluster {preview.plan.cluster}: {_source_text(proposed)}.",
            mode=spec.mode,
            target_products=list(spec.target_products),
            mig_layouts={key: dict(layout) if layout is not None else None for key, layout in spec.mig_layouts.items()},
            mig_strategy=spec.mig_strategy,
            replicas=spec.replicas,
            rename_shared=spec.rename_shared,
            fail_requests_greater_than_one=spec.fail_requests_greater_than_one,
            imported={"cluster": preview.plan.cluster, **spec.kept.to_json()},
            created_by=actor.user if getattr(actor.user, "pk", None) else None,
        )
        _check(profile)
        profile.save()
        source = {"cluster": preview.plan.cluster, "mig_config": proposed.mig_config,
                  "device_plugin_config": proposed.device_plugin_config, "nodes": list(proposed.nodes)}  # fmt: skip
        audit_record(actor=actor, action="profile.import", obj=profile, after={**profile_snapshot(profile), **source})
        created.append(profile)
    return created


def _source_text(proposed: ProposedProfile) -> str:
    parts = [f"mig-parted config {proposed.mig_config}"] if proposed.mig_config else []
    key = proposed.device_plugin_config
    parts.append(f"device-plugin config {key}" if key else "the ClusterPolicy's default device-plugin config")
    return " and ".join(parts)


def _meaning(snapshot: dict) -> dict:
    """The fields that decide what a profile renders to (all but its name and description)."""
    return {k: v for k, v in snapshot.items() if k not in ("name", "description")}


def _check_assignments_still_fit(profile: SharingProfile) -> None:
    nodes = Node.objects.live().filter(pin__profile=profile) | Node.objects.live().filter(
        pool__sharing__profile=profile
    )
    refuse_under_cluster_strategies(profile, nodes.distinct())
    problems = nodes_validation_errors(profile.to_spec(), nodes.distinct())
    if problems:
        raise ApplicationError(
            f"The change does not fit {_node_count(problems)} node(s) using this profile.",
            # What decides the fit: the layouts of a MIG profile, else the products it targets.
            errors={
                "mig_layouts" if profile.mode == "mig" else "target_products": [
                    f"{name}: {msg}" for name, msg in problems[:10]
                ]
            },
        )


@transaction.atomic
def profile_delete(*, actor: Actor, profile: SharingProfile) -> None:
    """Refuse while a pool or node uses the profile."""
    before = profile_snapshot(profile)
    try:
        audit_record(actor=actor, action="profile.delete", obj=profile, before=before)
        profile.delete()
    except ProtectedError as exc:
        users = ", ".join(sorted(str(o) for o in list(exc.protected_objects)[:5]))
        raise ApplicationError(f"Profile {profile.name} is in use ({users}); unassign it first.", status=409) from exc


def _node_count(problems: list[tuple[str, str]]) -> int:
    return len({name for name, _ in problems})


def nodes_validation_errors(spec: ProfileSpec, nodes) -> list[tuple[str, str]]:
    """(node name, reason) for every node the spec cannot apply to, with one query for all their GPUs."""
    gpus: dict[int, list[tuple[int, str]]] = {}
    names = {}
    for node_id, node_name, index, product in (
        Gpu.objects.live().filter(node__in=nodes).values_list("node_id", "node__name", "index", "product")
    ):
        gpus.setdefault(node_id, []).append((index, product))
        names[node_id] = node_name
    return [
        (names[node_id], msg) for node_id, node_gpus in gpus.items() for msg in node_validation_errors(spec, node_gpus)
    ]


def _lock_pool_sharing(pool: NodePool) -> PoolSharing | None:
    """The pool's sharing row, locked. The pool row is locked first: a FOR UPDATE on a row that does not exist yet
    locks nothing, so two first assignments would both insert; serialised on the pool, the second sees the first."""
    if not NodePool.objects.select_for_update().filter(pk=pool.pk).exists():
        raise ApplicationError(f"Pool {pool.name} was deleted meanwhile.", status=409)
    return PoolSharing.objects.select_for_update().filter(pool=pool).first()


def _lock_pin(node: Node) -> NodePin | None:
    """The node's pin, locked; the node row is locked first for the same reason as `_lock_pool_sharing`."""
    if not Node.objects.select_for_update().filter(pk=node.pk).exists():
        raise ApplicationError(f"Node {node.name} was deleted meanwhile.", status=409)
    return NodePin.objects.select_for_update().filter(node=node).first()


@transaction.atomic
def pool_set_profile(*, actor: Actor, pool: NodePool, profile: SharingProfile | None) -> PoolSharing | None:
    """Make `profile` the pool's default (None removes it); refused when it does not fit a member node's GPUs or
    contradicts the pool's QoS policy."""
    current = _lock_pool_sharing(pool)
    before = {"profile": current.profile.name if current and current.profile else None}
    if profile is not None:
        refuse_under_cluster_strategies(profile, pool.nodes.live(), (pool.cluster,))
        problems = nodes_validation_errors(profile.to_spec(), pool.nodes.live())
        if problems:
            raise ApplicationError(
                f"{profile.name} does not fit {_node_count(problems)} node(s) of pool {pool.name}.",
                errors={"profile": [f"{name}: {msg}" for name, msg in problems[:10]]},
            )
        if current and current.qos_policy:
            _check_consistency(current.qos_policy, [profile], field="profile")
    if (current.profile if current else None) == profile:
        return current
    sharing, _ = PoolSharing.objects.update_or_create(pool=pool, defaults={"profile": profile})
    audit_record(
        actor=actor,
        action="pool.set_profile",
        obj=pool,
        before=before,
        after={"profile": getattr(profile, "name", None)},
    )
    desired_state_changed.send(sender=PoolSharing)
    return sharing


@transaction.atomic
def node_pin_profile(*, actor: Actor, node: Node, profile: SharingProfile, reason: str = "", until=None) -> NodePin:
    """Pin a node to a profile, overriding pool and schedule (until `until`, when given), after checking it fits
    the node's GPUs and runs under its cluster's MIG strategy."""
    if until is not None and until <= timezone.now():
        raise ApplicationError("A pin must end in the future.", errors={"until": ["Give an instant in the future."]})
    refuse_under_cluster_strategies(profile, Node.objects.filter(pk=node.pk))
    problems = nodes_validation_errors(profile.to_spec(), Node.objects.filter(pk=node.pk))
    if problems:
        raise ApplicationError(
            f"{profile.name} does not fit {node.name}.", errors={"profile": [msg for _, msg in problems]}
        )
    current = _lock_pin(node)
    before = _pin_snapshot(current) if current else None
    user = actor.user if getattr(actor.user, "pk", None) else None
    pin, _ = NodePin.objects.update_or_create(
        node=node, defaults={"profile": profile, "reason": reason, "pinned_by": user, "until": until}
    )
    audit_record(actor=actor, action="node.pin", obj=node, before=before, after=_pin_snapshot(pin))
    desired_state_changed.send(sender=NodePin)
    return pin


def _pin_snapshot(pin: NodePin) -> dict:
    snapshot = {"profile": pin.profile.name, "reason": pin.reason}
    if pin.until is not None:
        snapshot["until"] = pin.until.isoformat()
    return snapshot


@transaction.atomic
def nodes_pin_profile(*, actor: Actor, nodes, profile: SharingProfile, reason: str = "", until=None) -> list[NodePin]:
    """Pin several nodes to a profile, all or none (the first node the profile does not fit refuses the lot)."""
    return [node_pin_profile(actor=actor, node=node, profile=profile, reason=reason, until=until) for node in nodes]


@transaction.atomic
def pins_expire(*, now=None) -> int:
    """Remove the pins whose `until` has passed (the desired state ignores them already), each audited as the
    expiry's unpin; the number removed."""
    now = now or timezone.now()
    expired = list(NodePin.objects.select_for_update().filter(until__lte=now).select_related("node", "profile"))
    for pin in expired:
        audit_record(
            actor=Actor.system("pin expiry"), action="node.unpin", obj=pin.node, before=_pin_snapshot(pin), after=None
        )
    NodePin.objects.filter(pk__in=[p.pk for p in expired]).delete()
    if expired:
        desired_state_changed.send(sender=NodePin)
    return len(expired)


@transaction.atomic
def node_unpin(*, actor: Actor, node: Node) -> None:
    """Return the node to its pool's (or schedule's) profile."""
    pin = _lock_pin(node)
    if pin is None:
        return
    audit_record(actor=actor, action="node.unpin", obj=node, before=_pin_snapshot(pin), after=None)
    pin.delete()
    desired_state_changed.send(sender=NodePin)


# --- QoS policies ----------------------------------------------------------------------------------------------------

QOS_FIELDS = tuple(
    f.name for f in QoSPolicy._meta.get_fields() if f.concrete and f.name not in ("id", "created_at", "updated_at")
)


def qos_snapshot(policy: QoSPolicy) -> dict:
    return {f: getattr(policy, f) for f in QOS_FIELDS}


def pool_boards(pools) -> list[tuple[GpuProduct, str]]:
    """(catalog product, "pool <name>") for each GPU model live in these pools; models outside the catalog have no
    known ranges and are left out."""
    rows = Gpu.objects.live().filter(node__pool__in=pools).values_list("node__pool__name", "product").distinct()
    boards = {(catalog_product(product), f"pool {pool}") for pool, product in rows}
    return sorted(((p, where) for p, where in boards if p is not None), key=lambda b: (b[1], b[0].name))


def policy_pools(policy: QoSPolicy):
    """The pools a saved policy applies to: as their default, in a schedule window, or as a schedule's baseline."""
    if policy.pk is None:
        return NodePool.objects.none()
    uses = Q(sharing__qos_policy=policy) | Q(schedule__windows__qos_policy=policy)
    return NodePool.objects.filter(uses | Q(schedule__baseline_qos_policy=policy)).distinct()


def qos_board_errors(policy: QoSPolicy, pools) -> dict[str, list[str]]:
    """The policy's GPU settings against the ranges of every GPU model in `pools` (MIG catalog, §4.3)."""
    settings = {name: getattr(policy, name) for name in BOARD_RANGE_FIELDS}
    if all(value is None for value in settings.values()):
        return {}
    return board_range_errors(settings, pool_boards(pools))


def qos_policy_check(policy: QoSPolicy, *, pools=()) -> dict[str, list[str]]:
    """The policy's problems per field (model rules, taint syntax, clock bounds, the GPU settings against the boards
    of the pools it applies to and of `pools`), saving nothing: the editor's live check and the create/update
    services share it."""
    errors: dict[str, list[str]] = {}
    try:
        policy.full_clean()
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if policy.exclusive_taint:
        try:
            parse_taint(policy.exclusive_taint)
        except ValueError as exc:
            errors.setdefault("exclusive_taint", []).append(str(exc))
    low, high = policy.gpu_clock_min_mhz, policy.gpu_clock_max_mhz
    if (low is None) != (high is None):
        errors.setdefault("gpu_clock_max_mhz", []).append("Give both the minimum and maximum locked clock, or neither.")
    elif low is not None and low > high:
        errors.setdefault("gpu_clock_max_mhz", []).append("The maximum clock must be at least the minimum.")
    if not errors:
        pool_ids = {p.pk for p in pools} | set(policy_pools(policy).values_list("pk", flat=True))
        for field, messages in qos_board_errors(policy, NodePool.objects.filter(pk__in=pool_ids)).items():
            errors.setdefault(field, []).extend(messages)
    return errors


def _check_qos(policy: QoSPolicy) -> None:
    _refuse("QoS policy", qos_policy_check(policy))


def _profiles_running_with(policy: QoSPolicy) -> list[SharingProfile]:
    """Every profile a node can run while this policy applies: pool defaults and the windows that use it."""
    profiles = set(SharingProfile.objects.filter(pools__qos_policy=policy))
    profiles |= {w.profile for w in policy.schedule_windows.select_related("profile")}
    return sorted(profiles, key=lambda p: p.name)


def _check_consistency(policy: QoSPolicy, profiles, *, field: str | None = "qos_policy") -> None:
    """Refuse a policy that contradicts a sharing mode it would run with (e.g. memory isolation on time-slicing):
    messages under `field`, or (None) under the policy's own fields they are about."""
    errors: dict[str, list[str]] = {}
    for profile in profiles:
        for key, messages in consistency_errors(policy.to_policy_spec(), profile.mode).items():
            errors.setdefault(field or key, []).extend(f"{profile.name}: {message}" for message in messages)
    if errors:
        raise ApplicationError(next(iter(errors.values()))[0], errors=errors)


def refuse_off_board(policy: QoSPolicy, pools, *, field: str | None = None) -> None:
    """Refuse a policy whose GPU settings some board of `pools` does not accept, naming value, range and board;
    errors keyed by the policy's fields, or all under `field` (e.g. the schedule window that names the policy)."""
    errors = qos_board_errors(policy, pools)
    if errors:
        messages = [m for ms in errors.values() for m in ms]
        raise ApplicationError(f"{policy.name}: {messages[0]}", errors={field: messages} if field else errors)


@transaction.atomic
def qos_policy_create(*, actor: Actor, **values) -> QoSPolicy:
    policy = QoSPolicy(**{k: v for k, v in values.items() if k in QOS_FIELDS})
    _check_qos(policy)
    policy.save()
    audit_record(actor=actor, action="qos.create", obj=policy, after=qos_snapshot(policy))
    return policy


@transaction.atomic
def qos_policy_update(*, actor: Actor, policy: QoSPolicy, **values) -> QoSPolicy:
    """Change a policy; refused if it would contradict a profile it runs with. Agent nodes get it by rollout."""
    policy = QoSPolicy.objects.select_for_update().get(pk=policy.pk)
    before = qos_snapshot(policy)
    for key in QOS_FIELDS:
        if key in values:
            setattr(policy, key, values[key])
    _check_qos(policy)
    if qos_snapshot(policy) == before:
        return policy
    _check_consistency(policy, _profiles_running_with(policy), field=None)
    policy.save()
    audit_record(actor=actor, action="qos.update", obj=policy, before=before, after=qos_snapshot(policy))
    desired_state_changed.send(sender=QoSPolicy)
    return policy


@transaction.atomic
def qos_policy_delete(*, actor: Actor, policy: QoSPolicy) -> None:
    try:
        audit_record(actor=actor, action="qos.delete", obj=policy, before=qos_snapshot(policy))
        policy.delete()
    except ProtectedError as exc:
        raise ApplicationError(f"QoS policy {policy.name} is in use; detach it first.", status=409) from exc


@transaction.atomic
def pool_set_qos_policy(*, actor: Actor, pool: NodePool, policy: QoSPolicy | None) -> PoolSharing:
    """Make `policy` the pool's default QoS policy (None removes it), checked against the pool's profiles."""
    current = _lock_pool_sharing(pool)
    if policy is not None:
        _check_consistency(policy, profiles_under_pool_policy(pool))
        refuse_off_board(policy, NodePool.objects.filter(pk=pool.pk))
    before = {"qos_policy": current.qos_policy.name if current and current.qos_policy else None}
    sharing, _ = PoolSharing.objects.update_or_create(pool=pool, defaults={"qos_policy": policy})
    after = {"qos_policy": policy.name if policy else None}
    if after != before:
        audit_record(actor=actor, action="pool.set_qos_policy", obj=pool, before=before, after=after)
        desired_state_changed.send(sender=PoolSharing)
    return sharing


@transaction.atomic
def qos_compliance_record(*, pool: NodePool, policy: QoSPolicy | None, now=None) -> QoSComplianceReport:
    """Check the pool's observed GPU pods (and kubelet settings) against `policy`; keep the result for the UI."""
    now = now or timezone.now()
    violations, mismatches, pods_checked = [], [], 0
    if policy is not None:
        pods, gpus, nodes = pool_pod_views(pool)
        pods_checked = len(pods)
        violations = [asdict(v) for v in check_pods(policy.workload_rules(), pods, gpus)]
        mismatches = kubelet_mismatches(policy, nodes)
    report, _ = QoSComplianceReport.objects.update_or_create(
        pool=pool,
        defaults={
            "policy": policy,
            "checked_at": now,
            "pods_checked": pods_checked,
            "violation_count": len(violations),
            "violations": violations,
            "kubelet_mismatches": mismatches,
        },
    )
    return report


KUBELET_SETTINGS = (("topology_manager_policy", "topologyManagerPolicy"), ("cpu_manager_policy", "cpuManagerPolicy"))


def kubelet_mismatches(policy: QoSPolicy, nodes) -> list[dict]:
    """Nodes whose kubelet runs other topology/CPU manager policies than the policy expects (read, not changed)."""
    result = []
    for node in nodes:
        for field, key in KUBELET_SETTINGS:
            expected = getattr(policy, field)
            actual = (node.kubelet_config or {}).get(key)
            if expected and actual is not None and actual != expected:
                result.append({"node": node.name, "setting": key, "expected": expected, "actual": actual})
    return result
