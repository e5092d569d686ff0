"""Model fields shared by every app: names that refuse control characters."""

import sys
import unicodedata
from functools import cache

from django.core.exceptions import ValidationError
from django.db import models

# Control (Cc: NUL, ESC, newline, DEL, C1) and format characters (Cf: bidi overrides, zero-width), and the line and
# paragraph separators: invisible or reordering in a page, a log line or a terminal, so a name could pose as another.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def validate_name(value: str) -> None:
    """Refuse a name with a control character, saying which one and where."""
    for position, char in enumerate(value, start=1):
        if unicodedata.category(char) in REFUSED_CATEGORIES:
            raise ValidationError(
                "Names cannot contain control characters (U+%(code)04X at position %(position)d).",
                code="control_character",
                params={"code": ord(char), "position": position},
            )


@cache
def refused_name_characters() -> tuple[tuple[int, int], ...]:
    """The code points validate_name refuses, as (first, last) ranges: for the API schema's pattern of names."""
    ranges: list[list[int]] = []
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)) in REFUSED_CATEGORIES:
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1][1] = code
            else:
                ranges.append([code, code])
    return tuple((first, last) for first, last in ranges)


class NameField(models.CharField):
    """A CharField for the names people give (clusters, pools, profiles, schedules, QoS policies) that refuses
    control characters: in full_clean, so in the services, the admin's forms and the API's ModelSerializers."""

    default_validators = [validate_name]

    def deconstruct(self):
        # A CharField in migrations: the validator is Python's, the column is the same; no migration per app.
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.CharField", args, kwargs
