"""Writes of desired sharing state: profiles, pool defaults and node pins — validated, audited, atomic."""

from django.db import transaction
from django.db.models import ProtectedError

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.models import Gpu, Node, NodePool
from sharing.models import NodePin, PoolSharing, SharingProfile
from sharing.signals import desired_state_changed
from sharing.spec import ProfileSpec, node_validation_errors, validate_spec

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


def _check(profile: SharingProfile) -> None:
    profile.full_clean(exclude=["created_by"])
    errors = validate_spec(profile.to_spec())
    if errors:
        first_field, messages = next(iter(errors.items()))
        raise ApplicationError(f"The profile is not valid: {messages[0]}", errors=errors)


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
    _check_assignments_still_fit(profile)
    profile.save()
    audit_record(actor=actor, action="profile.update", obj=profile, before=before, after=profile_snapshot(profile))
    desired_state_changed.send(sender=SharingProfile)
    return profile


def _check_assignments_still_fit(profile: SharingProfile) -> None:
    nodes = Node.objects.live().filter(pin__profile=profile) | Node.objects.live().filter(
        pool__sharing__profile=profile
    )
    problems = nodes_validation_errors(profile.to_spec(), nodes.distinct())
    if problems:
        raise ApplicationError(
            f"The change does not fit {len(problems)} node(s) using this profile.",
            errors={"non_field_errors": [f"{name}: {msg}" for name, msg in problems[:10]]},
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


@transaction.atomic
def pool_set_profile(*, actor: Actor, pool: NodePool, profile: SharingProfile | None) -> PoolSharing | None:
    """Make `profile` the pool's default (None removes it); refused when it does not fit a member node's GPUs."""
    current = PoolSharing.objects.select_for_update().filter(pool=pool).first()
    before = {"profile": current.profile.name} if current else None
    if profile is None:
        if current:
            current.delete()
            audit_record(actor=actor, action="pool.set_profile", obj=pool, before=before, after=None)
            desired_state_changed.send(sender=PoolSharing)
        return None
    problems = nodes_validation_errors(profile.to_spec(), pool.nodes.live())
    if problems:
        raise ApplicationError(
            f"{profile.name} does not fit {len(problems)} node(s) of pool {pool.name}.",
            errors={"profile": [f"{name}: {msg}" for name, msg in problems[:10]]},
        )
    if current and current.profile_id == profile.pk:
        return current
    sharing, _ = PoolSharing.objects.update_or_create(pool=pool, defaults={"profile": profile})
    audit_record(actor=actor, action="pool.set_profile", obj=pool, before=before, after={"profile": profile.name})
    desired_state_changed.send(sender=PoolSharing)
    return sharing


@transaction.atomic
def node_pin_profile(*, actor: Actor, node: Node, profile: SharingProfile, reason: str = "") -> NodePin:
    """Pin a node to a profile, overriding pool and schedule, after checking it fits the node's GPUs."""
    problems = nodes_validation_errors(profile.to_spec(), Node.objects.filter(pk=node.pk))
    if problems:
        raise ApplicationError(
            f"{profile.name} does not fit {node.name}.", errors={"profile": [msg for _, msg in problems]}
        )
    current = NodePin.objects.select_for_update().filter(node=node).first()
    before = {"profile": current.profile.name, "reason": current.reason} if current else None
    user = actor.user if getattr(actor.user, "pk", None) else None
    pin, _ = NodePin.objects.update_or_create(
        node=node, defaults={"profile": profile, "reason": reason, "pinned_by": user}
    )
    audit_record(
        actor=actor, action="node.pin", obj=node, before=before, after={"profile": profile.name, "reason": reason}
    )
    desired_state_changed.send(sender=NodePin)
    return pin


@transaction.atomic
def node_unpin(*, actor: Actor, node: Node) -> None:
    """Return the node to its pool's (or schedule's) profile."""
    pin = NodePin.objects.select_for_update().filter(node=node).first()
    if pin is None:
        return
    audit_record(actor=actor, action="node.unpin", obj=node, before={"profile": pin.profile.name}, after=None)
    pin.delete()
    desired_state_changed.send(sender=NodePin)
