"""A pool as its pages edit it: fleet's pool (name, cluster, selector or members), sharing's defaults (profile, QoS
policy) and its schedule, written in one transaction through each app's own services (each validates and audits)."""

from dataclasses import dataclass

from django.db import transaction

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet import services as fleet_services
from fleet.models import Cluster, Node, NodePool
from scheduling import services
from scheduling.models import Schedule
from sharing import services as sharing_services
from sharing.models import PoolSharing, QoSPolicy, SharingProfile

KEEP = "keep"  # the pool's schedule stays as it is (or it keeps having none)
NO_SCHEDULE = "none"  # the pool's schedule, if any, is deleted


@dataclass(frozen=True)
class PoolSettings:
    """Everything the pool editor sets. `members` (explicit pools only) None leaves them; `schedule` is KEEP,
    NO_SCHEDULE or a schedule to copy (its zone, baseline, windows and holidays) as the pool's own."""

    name: str
    description: str = ""
    node_selector: str = ""
    members: tuple[Node, ...] | None = None
    profile: SharingProfile | None = None
    qos_policy: QoSPolicy | None = None
    schedule: Schedule | str = KEEP


def _set_defaults(actor: Actor, pool: NodePool, profile, policy) -> None:
    """Profile and QoS policy: each is checked against the other as it stands, so when the new pair is consistent
    but one order passes through an inconsistent pair, the other order is tried before refusing."""
    steps = (
        lambda: sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile),
        lambda: sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy),
    )
    current = PoolSharing.objects.filter(pool=pool).first()
    if current is None and profile is None and policy is None:
        return  # nothing to record for a pool that has no defaults and gets none
    try:
        with transaction.atomic():
            for step in steps:
                step()
    except ApplicationError as first:
        try:
            with transaction.atomic():
                for step in reversed(steps):
                    step()
        except ApplicationError:
            raise first from None


def _set_schedule(actor: Actor, pool: NodePool, choice) -> None:
    current = Schedule.objects.filter(pool=pool).first()
    if choice == KEEP or (current is not None and choice == current):
        return
    if current is not None:
        services.schedule_delete(actor=actor, schedule=current)
    if isinstance(choice, Schedule):
        services.schedule_create(
            actor=actor,
            pool=pool,
            windows=services.schedule_rows(choice),
            exceptions=[{"date": e.date, "note": e.note} for e in choice.exceptions.all()],
            **{field: getattr(choice, field) for field in services.SCHEDULE_FIELDS},
        )


@transaction.atomic
def pool_save(*, actor: Actor, settings: PoolSettings, pool: NodePool | None = None, cluster: Cluster | None = None):
    """Create (with `cluster`) or change `pool`; refused as a whole when any part is (an overlapping selector, a
    profile that does not fit the members, a QoS policy contradicting it, a schedule that does not fit). A selector
    is applied at once, so the defaults and the schedule are checked against the nodes it selects."""
    values = {"name": settings.name, "description": settings.description, "node_selector": settings.node_selector}
    if pool is None:
        pool = fleet_services.pool_create(actor=actor, cluster=cluster, **values)
        selector_changed = bool(settings.node_selector)
    else:
        selector_changed = settings.node_selector != pool.node_selector
        pool = fleet_services.pool_update(actor=actor, pool=pool, **values)
    if settings.node_selector and selector_changed:
        fleet_services.pool_apply_selector(pool=pool)
    elif not settings.node_selector and settings.members is not None:
        fleet_services.pool_set_members(actor=actor, pool=pool, nodes=settings.members)
    _set_defaults(actor, pool, settings.profile, settings.qos_policy)
    _set_schedule(actor, pool, settings.schedule)
    return pool


@transaction.atomic
def pool_remove(*, actor: Actor, pool: NodePool) -> None:
    """Delete a pool: its schedule first (audited on its own), then the pool; its nodes belong to no pool after."""
    schedule = Schedule.objects.filter(pool=pool).first()
    if schedule is not None:
        services.schedule_delete(actor=actor, schedule=schedule)
    fleet_services.pool_delete(actor=actor, pool=pool)
