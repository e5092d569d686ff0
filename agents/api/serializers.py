"""Agent endpoints and their admin: request bodies decoded exactly as agent/protocol.py's codec decodes them (the
schema's mirror of the messages is fleet/api/protocol.py), and join tokens and agent credentials as admins see them."""

import dataclasses
import functools
import types
import typing
from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from agent import protocol
from agents.claims import OWNERS
from core.api.fields import RefField, db_max_value
from fleet.models import AgentCredential, AgentJoinToken, Cluster, PendingAgent, UuidConflict

# --- decoding: the protocol's codec, compiled -----------------------------------------------------------------------


class _Invalid(Exception):
    """A decoding failure on its way up: the path grows at each level, formatted once at the top."""

    def __init__(self, problem: str, path: list[str] | None = None):
        self.problem, self.path = problem, path or []


def _primitive(tp: type):
    name = tp.__name__
    if tp is float:

        def decode(value):
            if type(value) is float:
                return value
            if type(value) is int:
                return float(value)
            raise _Invalid(f"must be float, not {value!r}")

        return decode

    def decode(value):
        if type(value) is tp:
            return value
        raise _Invalid(f"must be {name}, not {value!r}")

    return decode


@functools.cache
def _decoder(hint):
    """A function decoding one JSON value into `hint`, exactly as agent/protocol.py's codec does."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        inner, bounds = typing.get_args(hint)
        inner_decode = _decoder(inner)

        def decode_bounded(value):
            problem = bounds.problem(value)
            if problem is not None:
                raise _Invalid(problem)
            return inner_decode(value)

        return decode_bounded
    if origin in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        inner_decode = _decoder(inner)
        if type(None) not in typing.get_args(hint):
            return inner_decode
        return lambda value: None if value is None else inner_decode(value)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        text = ", ".join(map(str, allowed))

        def decode_literal(value):
            if value not in allowed:
                raise _Invalid(f"must be one of {text}, not {value!r}")
            return value

        return decode_literal
    if origin is tuple:
        item = _decoder(typing.get_args(hint)[0])

        def decode_tuple(value):
            if not isinstance(value, list):
                raise _Invalid(f"must be a list, not {value!r}")
            out = []
            for i, element in enumerate(value):
                try:
                    out.append(item(element))
                except _Invalid as error:
                    error.path.insert(0, f"[{i}]")
                    raise
            return tuple(out)

        return decode_tuple
    if dataclasses.is_dataclass(hint):
        return _dataclass_decoder(hint)
    if hint is dict or origin is dict:

        def decode_dict(value):
            if not isinstance(value, dict):
                raise _Invalid(f"must be an object, not {value!r}")
            return dict(value)

        return decode_dict
    return _primitive(hint)


def _exact_type(hint):
    """(the plain JSON type a value of this hint may take as is when its bounds hold it, those bounds or None,
    whether null is allowed)."""
    nullable = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        nullable = type(None) in typing.get_args(hint)
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    bounds = None
    if typing.get_origin(hint) is typing.Annotated:
        hint, bounds = typing.get_args(hint)
    return (hint if hint in (str, int, bool, float) else None), bounds, nullable


def _dataclass_decoder(cls):
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = [
        (
            f.name,
            *_exact_type(hints[f.name]),
            _decoder(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    ]
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    factories = {f.name for f in dataclasses.fields(cls) if f.default_factory is not dataclasses.MISSING}
    # The protocol's messages are plain frozen dataclasses: filling __dict__ is what their __init__ does, 5x faster.
    plain = not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")
    missing = object()

    def decode_dataclass(value):
        if not isinstance(value, dict):
            raise _Invalid(f"must be an object, not {value!r}")
        instance = object.__new__(cls) if plain else None
        kwargs = instance.__dict__ if plain else {}
        for name, exact, bounds, nullable, decode, required in fields:
            raw = value.get(name, missing)
            # Most fields are plain values of their exact type, within bounds, or null: checked inline.
            if (type(raw) is exact and (bounds is None or bounds.holds(raw))) or (raw is None and nullable):
                kwargs[name] = raw
                continue
            if raw is missing:
                if required:
                    raise _Invalid("is required", [f".{name}"])
                default = defaults[name]
                kwargs[name] = default() if name in factories else default
                continue
            try:
                kwargs[name] = decode(raw)
            except _Invalid as error:
                error.path.insert(0, f".{name}")
                raise
        return instance if plain else cls(**kwargs)

    return decode_dataclass


def protocol_decode(message: type, data: object):
    """`message.from_dict(data)` of agent/protocol.py, compiled once per message type (the report path's budget is
    a fraction of a millisecond); the same values and the same ProtocolError texts."""
    try:
        return _decoder(message)(data)
    except _Invalid as error:
        raise protocol.ProtocolError(f"{message.__name__}{''.join(error.path)} {error.problem}") from None


# --- admin: join tokens and credentials ---------------------------------------------------------------------------


class AgentJoinTokenSerializer(serializers.ModelSerializer):
    """A join token without its secret (shown once, at creation)."""

    cluster = RefField("cluster-detail", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    state = serializers.SerializerMethodField()

    class Meta:
        model = AgentJoinToken
        fields = [
            "id",
            "cluster",
            "name",
            "description",
            "key_id",
            "expires_at",
            "max_uses",
            "uses",
            "node_name_pattern",
            "service_account",
            "state",
            "created_by",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]
        read_only_fields = fields

    def get_state(self, token) -> str:
        """active, revoked, expired or used_up."""
        if token.revoked_at is not None:
            return "revoked"
        if token.expires_at <= timezone.now():
            return "expired"
        if token.max_uses is not None and token.uses >= token.max_uses:
            return "used_up"
        return "active"


class AgentJoinTokenCreatedSerializer(AgentJoinTokenSerializer):
    token = serializers.CharField(help_text="The join token; shown this once, never stored in plain.")

    class Meta(AgentJoinTokenSerializer.Meta):
        fields = [*AgentJoinTokenSerializer.Meta.fields, "token"]


class AgentJoinTokenCreateSerializer(serializers.Serializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    expires_at = serializers.DateTimeField(required=False, help_text="Default: 24 hours from now.")
    max_uses = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=db_max_value(AgentJoinToken, "max_uses"),
        help_text="Empty: any number of new nodes until it expires; 1: single-use.",
    )
    node_name_pattern = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=253,
        help_text="Shell-style pattern (fnmatch) of the node names it registers, e.g. rack-b12-*; empty: any.",
    )
    service_account = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=317,
        help_text="namespace:name: agents also present this service account's token, reviewed by the cluster's "
        "API server, and register as their pod's node (deploy/overlays/agent-only/agent-daemonset.yaml); "
        "empty: no review.",
    )

    def validate_expires_at(self, value):
        if value > timezone.now() + timedelta(days=365):
            raise serializers.ValidationError("A join token lives at most a year.")
        return value


class AgentCredentialSerializer(serializers.ModelSerializer):
    """A node's agent credential: when it was issued and used, and whether it is revoked (never its secret)."""

    node = RefField("node-detail", read_only=True)
    join_token = serializers.SlugRelatedField(slug_field="name", read_only=True)
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = AgentCredential
        fields = ["id", "node", "key_id", "join_token", "active", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = fields


class PendingAgentSerializer(serializers.ModelSerializer):
    """An agent asking to register an existing node without its credential; the fingerprint is in its log."""

    node = RefField("node-detail", read_only=True)
    join_token = serializers.SlugRelatedField(slug_field="name", read_only=True)
    decided_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    fingerprint = serializers.CharField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True, help_text="Approvable until then, while it waits.")

    class Meta:
        model = PendingAgent
        fields = [
            "id",
            "node",
            "fingerprint",
            "status",
            "join_token",
            "agent_version",
            "address",
            "requested_at",
            "expires_at",
            "last_asked_at",
            "decided_at",
            "decided_by",
        ]
        read_only_fields = fields


class UuidConflictSerializer(serializers.ModelSerializer):
    """A UUID a node (`node`, the reporter) reported while another (`holder`) holds it; open until `resolved_at`."""

    node = RefField("node-detail", read_only=True)
    holder = RefField("node-detail", read_only=True)

    class Meta:
        model = UuidConflict
        fields = ["id", "node", "holder", "uuid", "kind", "first_seen_at", "last_seen_at", "reports", "resolved_at"]
        read_only_fields = fields


class UuidConflictResolveSerializer(serializers.Serializer):
    owner = serializers.ChoiceField(
        choices=OWNERS, help_text="holder: the UUID stays where it is; reporter: the holder's GPU is released."
    )
