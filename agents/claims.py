"""A node speaks only for itself: a report may name a GPU or MIG device UUID that is new or already its node's, never
one another live node holds. Read on the inventory path only (an unchanged inventory was checked when recorded), so
the usual report pays nothing for it."""

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from agent.protocol import Report
from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.models import Gpu, MigDevice, Node, UuidConflict

_NAMED = 5  # UUIDs named in a refusal's message; the field errors list all
OWNERS = ("holder", "reporter")  # who keeps a UUID when an admin settles a conflict


@dataclass(frozen=True)
class Claim:
    """A UUID of the report that another live node holds."""

    uuid: str
    kind: str  # UuidConflict.Kind
    holder_id: int
    holder_name: str


def _reported_mig_uuids(report: Report) -> list[str]:
    return [d.uuid for g in report.gpus if g.mig_mode_current for d in g.mig_devices if d.uuid]


def _refuse_duplicates(report: Report) -> None:
    """A UUID twice in one report is no inventory: 400 naming it (the database would refuse it halfway)."""
    for name, uuids in (("gpus", [g.uuid for g in report.gpus]), ("mig_devices", _reported_mig_uuids(report))):
        seen: set[str] = set()
        for uuid in uuids:
            if uuid in seen:
                problem = f"UUID {uuid[:64]} appears twice"
                raise ApplicationError(f"Invalid input: {name}: {problem}", errors={name: [problem]})
            seen.add(uuid)


def foreign_claims(node: Node, report: Report) -> list[Claim]:
    """The report's GPU and MIG device UUIDs that a live GPU of another live node holds. A gone GPU, or one of a
    gone node, may move: hardware does (its history moves with it)."""
    gpus = (
        Gpu.objects.filter(uuid__in=[g.uuid for g in report.gpus], gone_at__isnull=True, node__gone_at__isnull=True)
        .exclude(node_id=node.pk)
        .values_list("uuid", "node_id", "node__name")
    )
    claims = [Claim(uuid, UuidConflict.Kind.GPU, holder, name) for uuid, holder, name in gpus]
    mig_uuids = _reported_mig_uuids(report)
    if mig_uuids:
        devices = (
            MigDevice.objects.filter(uuid__in=mig_uuids, gpu__gone_at__isnull=True, gpu__node__gone_at__isnull=True)
            .exclude(gpu__node_id=node.pk)
            .values_list("uuid", "gpu__node_id", "gpu__node__name")
        )
        claims += [Claim(uuid, UuidConflict.Kind.MIG, holder, name) for uuid, holder, name in devices]
    return sorted(claims, key=lambda c: (c.kind, c.uuid))


def refuse_foreign_uuids(*, node: Node, report: Report, now=None) -> None:
    """Refuse (409) a report naming UUIDs another live node holds, after recording the conflict (audited once, on
    both nodes, when it opens); nothing of the report is stored. A UUID twice in the report is a 400."""
    _refuse_duplicates(report)
    claims = foreign_claims(node, report)
    if not claims:
        return
    uuid_conflicts_record(node=node, claims=claims, now=now or timezone.now())
    named = "; ".join(f"{c.kind.upper()} {c.uuid} is held by node {c.holder_name}" for c in claims[:_NAMED])
    more = f" and {len(claims) - _NAMED} more" if len(claims) > _NAMED else ""
    raise ApplicationError(
        f"Report refused: {named}{more}. A node reports its own GPUs only; a GPU that moved is accepted once its "
        "former node no longer reports it.",
        errors={"gpus": [f"{c.kind} {c.uuid} is held by node {c.holder_name} (id {c.holder_id})" for c in claims]},
        status=409,
    )


@transaction.atomic
def uuid_conflicts_record(*, node: Node, claims: Sequence[Claim], now) -> list[UuidConflict]:
    """Open a conflict per claimed UUID (audited on the reporter and on each holder), or count one more refused
    report for those already open. Returns the conflicts opened now."""
    opened = []
    for claim in claims:
        still_open = UuidConflict.objects.filter(node=node, uuid=claim.uuid, resolved_at__isnull=True)
        if still_open.update(last_seen_at=now, reports=F("reports") + 1):
            continue
        try:
            with transaction.atomic():
                opened.append(
                    UuidConflict.objects.create(
                        node=node,
                        holder_id=claim.holder_id,
                        uuid=claim.uuid,
                        kind=claim.kind,
                        first_seen_at=now,
                        last_seen_at=now,
                    )
                )
        except IntegrityError:
            continue  # a concurrent report of the same node opened it
    _audit_opened(node, opened, now)
    return opened


def _audit_opened(node: Node, opened: list[UuidConflict], now) -> None:
    by_holder: dict[int, list[UuidConflict]] = {}
    for conflict in opened:
        by_holder.setdefault(conflict.holder_id, []).append(conflict)
    actor = Actor.system("tessera-agent")
    for holder_id, conflicts in by_holder.items():
        holder = Node.objects.get(pk=holder_id)
        uuids = [f"{c.kind} {c.uuid}" for c in conflicts]
        after = {"reporter": node.name, "holder": holder.name, "uuids": uuids}
        audit_record(
            actor=actor,
            action="node.uuid_conflict",
            obj=node,
            after=after,
            message=f"The agent reported {', '.join(uuids)} held by node {holder.name}: the report was refused.",
            now=now,
        )
        audit_record(
            actor=actor,
            action="node.uuid_claimed",
            obj=holder,
            after=after,
            message=f"The agent of node {node.name} reported {', '.join(uuids)} of this node: refused, kept here.",
            now=now,
        )


def uuid_conflicts_resolve(*, node: Node, now) -> int:
    """Close the node's open conflicts: its report was accepted, so it names no UUID another live node holds."""
    return UuidConflict.objects.filter(node=node, resolved_at__isnull=True).update(resolved_at=now)


def release_stale_mig_uuids(node: Node, report: Report) -> None:
    """Free the reported MIG device UUIDs still stored on another GPU that is this node's or no longer live: that
    row would be replaced anyway, and the UUID's uniqueness would refuse the new one first. A live one of another
    node stays (storing the report then fails on the UUID: a 409)."""
    reported = {d.uuid: g.uuid for g in report.gpus if g.mig_mode_current for d in g.mig_devices if d.uuid}
    if not reported:
        return
    releasable = Q(gpu__node=node) | Q(gpu__gone_at__isnull=False) | Q(gpu__node__gone_at__isnull=False)
    stored = MigDevice.objects.filter(releasable, uuid__in=list(reported)).values_list("pk", "uuid", "gpu__uuid")
    stale = [pk for pk, uuid, gpu_uuid in stored if reported[uuid] != gpu_uuid]
    if stale:
        MigDevice.objects.filter(pk__in=stale).delete()


@transaction.atomic
def uuid_conflict_resolve(*, actor: Actor, conflict: UuidConflict, owner: str, now=None) -> UuidConflict:
    """An admin settles an open conflict, audited on both nodes. `holder`: the UUID stays where it is and the conflict
    closes (after revoking an impostor's credential, say); the reporter naming it again is refused again.
    `reporter`: the holder was wrong (it reported the GPU first); its GPU is marked gone (its MIG device forgotten),
    so the reporter's next report is accepted and the GPU's history moves with it. The holder's next report is read
    whole: while both nodes keep reporting the UUID, the first to report it holds it, so revoke the wrong node's
    credential before settling."""
    if owner not in OWNERS:
        problem = f"must be one of: {', '.join(OWNERS)}"
        raise ApplicationError(f"Invalid input: owner: {problem}", errors={"owner": [problem]})
    now = now or timezone.now()
    conflict = UuidConflict.objects.select_for_update().select_related("node", "holder").get(pk=conflict.pk)
    if conflict.resolved_at is not None:
        raise ApplicationError("This conflict is resolved already.", status=409)
    if owner == "reporter":
        if conflict.kind == UuidConflict.Kind.GPU:
            Gpu.objects.filter(node=conflict.holder, uuid=conflict.uuid, gone_at__isnull=True).update(gone_at=now)
        else:
            MigDevice.objects.filter(gpu__node=conflict.holder, uuid=conflict.uuid).delete()
        Node.objects.filter(pk=conflict.holder_id).update(agent_report_hash="")
    conflict.resolved_at = now
    conflict.save(update_fields=["resolved_at"])
    kept_by = conflict.holder if owner == "holder" else conflict.node
    what = f"{conflict.get_kind_display()} {conflict.uuid}"
    after = {"uuid": conflict.uuid, "kind": conflict.kind, "reporter": conflict.node.name,
             "holder": conflict.holder.name, "owner": kept_by.name}  # fmt: skip
    for node in (conflict.node, conflict.holder):
        audit_record(
            actor=actor,
            action="node.uuid_conflict_resolved",
            obj=node,
            after=after,
            message=f"Conflict over {what} settled: it belongs to node {kept_by.name}.",
            now=now,
        )
    return conflict
