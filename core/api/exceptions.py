"""One error shape for every API error: {"message": "...", "errors": {"field": ["..."]}}."""

from django.conf import settings
from django.core.exceptions import (
    NON_FIELD_ERRORS,
    PermissionDenied,
    RequestDataTooBig,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from core.exceptions import ApplicationError

OUT_OF_RANGE = "A value is out of range for its field."
BIGINT_MAX = 2**63 - 1


def _nested(field, sub) -> str:
    """`field.sub`, or `field[i].rest` when DRF keyed a list's errors by index (rows of a PATCH, list items)."""
    index, dot, rest = str(sub).partition(".")
    return f"{field}[{index}]{dot}{rest}" if index.isdigit() else f"{field}.{sub}"


def _flatten(detail) -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out = {}
        for field, value in detail.items():
            if isinstance(value, dict):
                for sub, messages in _flatten(value).items():
                    out[_nested(field, sub)] = messages
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                for i, item in enumerate(value):
                    for sub, messages in _flatten(item).items():
                        out[f"{field}[{i}].{sub}"] = messages
            else:
                out[field] = [str(v) for v in (value if isinstance(value, list) else [value])]
        return out
    if isinstance(detail, list):
        return {"non_field_errors": [str(v) for v in detail]}
    return {}


def _path_id_out_of_range(view) -> bool:
    """The URL's object id is beyond a 64-bit key (every primary key here is one, DEFAULT_AUTO_FIELD)."""
    values = getattr(view, "kwargs", None) or {}
    return any(str(v).isdigit() and int(v) > BIGINT_MAX for v in values.values())


def exception_handler(exc, context):
    """Translate DRF, Django and domain errors into the one shape."""
    if isinstance(exc, ApplicationError):
        return Response({"message": exc.message, "errors": exc.errors}, status=exc.status)
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
        # Errors of the whole model (a constraint over several fields) go under DRF's key: one name for clients.
        non_field = api_settings.NON_FIELD_ERRORS_KEY
        exc = exceptions.ValidationError({non_field if f == NON_FIELD_ERRORS else f: m for f, m in detail.items()})
    elif isinstance(exc, RequestDataTooBig):
        exc = exceptions.ParseError(f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.")
    elif isinstance(exc, TooManyFieldsSent | TooManyFilesSent):
        exc = exceptions.ParseError("The request has too many fields or files.")
    elif isinstance(exc, OverflowError | DataError) and _path_id_out_of_range(context.get("view")):
        exc = exceptions.NotFound()  # an id no column can hold names no object
    elif isinstance(exc, OverflowError | DataError):
        # A number beyond its column's range that no serializer bound caught (SQLite: OverflowError; PostgreSQL:
        # DataError "out of range"): the input's fault, never a 500.
        exc = exceptions.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: [OUT_OF_RANGE]})
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        first = next(iter(errors.items()), None)
        message = "Invalid input." if first is None else f"Invalid input: {first[0]}: {first[1][0]}"
        if first and first[0] == "non_field_errors":
            message = first[1][0]
        response.data = {"message": message, "errors": errors}
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        response.data = {"message": str(detail), "errors": {}}
    return response
