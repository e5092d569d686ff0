"""Recording audit events: one function every service calls inside its own transaction."""

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.utils import timezone

from core.models import AuditEvent


@dataclass(frozen=True)
class Actor:
    """Who acts: a user (through the UI or a token), a schedule, or Tessera itself."""

    kind: str
    label: str
    user: object = None

    @classmethod
    def from_request(cls, request) -> "Actor":
        kind = AuditEvent.ActorKind.TOKEN if getattr(request, "auth", None) is not None else AuditEvent.ActorKind.USER
        return cls(kind, request.user.get_username(), request.user)

    @classmethod
    def for_user(cls, user) -> "Actor":
        return cls(AuditEvent.ActorKind.USER, user.get_username(), user)

    @classmethod
    def system(cls, component: str = "tessera") -> "Actor":
        return cls(AuditEvent.ActorKind.SYSTEM, component)

    @classmethod
    def schedule(cls, name: str) -> "Actor":
        return cls(AuditEvent.ActorKind.SCHEDULE, name)


_collected: ContextVar[list | None] = ContextVar("audit_collected", default=None)


@contextmanager
def audit_collected():
    """Within the block, audit_record keeps its events (unsaved) in the list yielded instead of writing them: a
    change made of many service calls (a config apply) is then recorded as the one event it is."""
    events: list[AuditEvent] = []
    token = _collected.set(events)
    try:
        yield events
    finally:
        _collected.reset(token)


def audit_record(*, actor: Actor, action: str, obj, before=None, after=None, message: str = "", now=None) -> AuditEvent:
    """Append one event; call it inside the transaction of the change it describes, so both commit or neither."""
    event = AuditEvent(
        at=now or timezone.now(),
        actor=actor.user if getattr(actor.user, "pk", None) else None,
        actor_kind=actor.kind,
        actor_label=actor.label[:200],
        action=action,
        object_type=obj._meta.model_name,
        object_id=str(obj.pk),
        object_repr=str(obj)[:300],
        before=before,
        after=after,
        message=message,
    )
    collected = _collected.get()
    if collected is not None:
        collected.append(event)
    else:
        event.save()
    return event


def audit_batch(*, actor: Actor, action: str, label: str, events: list[AuditEvent], message: str = "") -> AuditEvent:
    """The one event standing for `events` (collected by audit_collected): each listed in `after` with its action,
    object, before and after."""
    changes = [
        {
            "action": e.action,
            "object_type": e.object_type,
            "object": e.object_repr,
            "before": e.before,
            "after": e.after,
        }
        for e in events
    ]
    return AuditEvent.objects.create(
        at=timezone.now(),
        actor=actor.user if getattr(actor.user, "pk", None) else None,
        actor_kind=actor.kind,
        actor_label=actor.label[:200],
        action=action,
        object_type="config",
        object_id="",
        object_repr=label[:300],
        after={"changes": changes},
        message=message,
    )
