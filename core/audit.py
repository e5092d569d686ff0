"""Recording audit events: one function every service calls inside its own transaction."""

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


def audit_record(*, actor: Actor, action: str, obj, before=None, after=None, message: str = "", now=None) -> AuditEvent:
    """Append one event; call it inside the transaction of the change it describes, so both commit or neither."""
    return AuditEvent.objects.create(
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
