"""The OpenAPI schema of every endpoint, made true in one place: the error responses any view can give (the one error
shape of core/api/exceptions.py), and the rules of shared fields the generator does not read from the serializers.
Schemathesis checks the API against it in CI (tests/core/test_api_schema_fuzz.py)."""

from functools import cache

from django.core.exceptions import FieldDoesNotExist
from drf_spectacular import openapi
from rest_framework import serializers

from core.fields import refused_name_characters, validate_name

# Wall-clock times as TimeField reads and writes them ("08:00", "08:00:00", "08:00:00.5"): no offset, so not
# OpenAPI's `format: time` (RFC 3339 full-time, which needs one).
TIME_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?$"
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class ErrorSerializer(serializers.Serializer):
    """Every API error: a message for people and the messages per field (empty when no field is to blame)."""

    message = serializers.CharField()
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


ERRORS = {
    "400": "Invalid input: a message per field in `errors`.",
    "401": "No credentials, or credentials that are unknown, expired or revoked.",
    "403": "The caller's role does not allow this.",
    "404": "No such object, or no such page of a list.",
    "409": "The object's state does not allow this now (e.g. a rollout that has finished).",
}


class AutoSchema(openapi.AutoSchema):
    """drf-spectacular's AutoSchema, plus the errors every operation can answer with and the shared field rules."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is not None:
            self._add_error_responses(operation)
        return operation

    def _get_paginator(self):
        # Only GET lists are paged; an action that answers a write with a list (pin, import) returns it whole.
        return super()._get_paginator() if self.method == "GET" else None

    def _add_error_responses(self, operation: dict) -> None:
        """Document the errors this operation can give, unless the view documents them itself (the agent protocol
        has its own error body)."""
        parameters = operation.get("parameters", [])
        codes = []
        if "requestBody" in operation or any(p["in"] == "query" for p in parameters):
            codes.append("400")
        if operation.get("security") and operation["security"] != [{}]:
            codes += ["401", "403"]
        # `format` names a renderer; one that does not exist is DRF's 404.
        if any(p["in"] == "path" or p["name"] in ("page", "format") for p in parameters):
            codes.append("404")
        if self.method in UNSAFE:
            codes.append("409")
        responses = operation.setdefault("responses", {})
        error = self.resolve_serializer(ErrorSerializer, "response").ref
        for code in codes:
            if code not in responses:
                responses[code] = {"content": {"application/json": {"schema": error}}, "description": ERRORS[code]}

    def _get_serializer_field_meta(self, field, direction):
        meta = super()._get_serializer_field_meta(field, direction)
        if direction == "response" and isinstance(field, serializers.Field) and _source_is_nullable(field):
            meta["nullable"] = True
        return meta

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if isinstance(field, serializers.TimeField):
            schema.pop("format", None)
            schema.update(pattern=TIME_PATTERN, example="08:00")
        elif isinstance(field, serializers.ListField | serializers.ManyRelatedField) and not field.allow_empty:
            schema.setdefault("minItems", 1)
        elif isinstance(field, serializers.CharField) and _is_name(field):
            schema["pattern"] = name_pattern()
        return schema


def _source_is_nullable(field) -> bool:
    """Whether a ModelSerializer field reads a column or relation that may be empty (a read-only field declared
    without allow_null still outputs null then: a rollout's pool once the pool is gone)."""
    model = getattr(getattr(field.parent, "Meta", None), "model", None)
    if model is None or field.source == "*":
        return False
    for name in field.source.split("."):
        try:
            model_field = model._meta.get_field(name)
        except (FieldDoesNotExist, AttributeError):
            return False
        if model_field.null:
            return True
        model = model_field.related_model
        if model is None:
            return False
    return False


def _is_name(field) -> bool:
    return any(validator is validate_name for validator in field.validators)


@cache
def name_pattern() -> str:
    """The names NameField accepts, as a regular expression (JSON Schema has no Unicode categories)."""
    # \uXXXX means the same to ECMA-262, Python and Rust regular expressions; the few refused characters beyond the
    # BMP (hieroglyph and musical format controls, tags) have no escape all three read, so only the server names them.
    ranges = [
        f"\\u{first:04X}" if first == last else f"\\u{first:04X}-\\u{last:04X}"
        for first, last in refused_name_characters()
        if last <= 0xFFFF
    ]
    return f"^[^{''.join(ranges)}]*$"
