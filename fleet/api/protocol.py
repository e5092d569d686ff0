"""The wire messages of agent/protocol.py mirrored as serializers, for the OpenAPI schema only: the agent endpoints
(agents/api/) and the node's readings in fleet's own API (host settings, the QoS node settings applied) document
them; bodies are decoded by the protocol's codec, so there is one definition of the contract."""

import dataclasses
import functools
import types
import typing

from rest_framework import serializers

from agent import protocol

# Generated from the protocol's dataclasses and their type hints, so the schema cannot drift from the contract.

TIME_SLICE_INTERVALS = list(typing.get_args(protocol.TimeSliceInterval))  # SPECTACULAR_SETTINGS names its enum


def _field(hint, *, required: bool) -> serializers.Field:
    kwargs: dict = {"required": required}
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        kwargs["allow_null"] = True
    if typing.get_origin(hint) is typing.Annotated:
        hint, bounds = typing.get_args(hint)
        if isinstance(bounds, protocol.Text):
            kwargs["max_length"] = bounds.max_length
        else:
            kwargs.update(min_value=bounds.low, max_value=bounds.high)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return serializers.ChoiceField(choices=list(typing.get_args(hint)), **kwargs)
    if origin is tuple:
        return protocol_serializer(typing.get_args(hint)[0])(many=True, **kwargs)
    if dataclasses.is_dataclass(hint):
        return protocol_serializer(hint)(**kwargs)
    if hint is dict or origin is dict:
        return serializers.DictField(child=serializers.ListField(child=serializers.CharField()), **kwargs)
    if hint is str:
        return serializers.CharField(allow_blank=True, trim_whitespace=False, **kwargs)
    return {int: serializers.IntegerField, float: serializers.FloatField, bool: serializers.BooleanField}[hint](
        **kwargs
    )


@functools.cache
def protocol_serializer(message: type) -> type[serializers.Serializer]:
    """A serializer documenting one message of agent/protocol.py (component `Agent<Message>`); never used to parse:
    bodies go through the protocol's own codec."""
    hints = typing.get_type_hints(message, include_extras=True)
    attrs = {
        f.name: _field(
            hints[f.name], required=f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        for f in dataclasses.fields(message)
    }
    attrs["__doc__"] = message.__doc__ if message.__doc__ and not message.__doc__.startswith(message.__name__) else ""
    attrs["__module__"] = __name__
    name = "Agent" + ("Error" if message is protocol.ErrorBody else message.__name__) + "Serializer"
    return type(name, (serializers.Serializer,), attrs)


PROTOCOL_MIRRORS = {
    name: protocol_serializer(message)
    for name, message in vars(protocol).items()
    if isinstance(message, type) and issubclass(message, protocol.Message) and message is not protocol.Message
}
