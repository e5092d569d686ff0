"""Label and field selectors with the grammar and error messages of the Kubernetes API server."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from simulator.errors import ApiError

_KEY = re.compile(r"^([a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?/)?[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")
_SET_OP = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s+(in|notin)\s*\((.*)\)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside an `in (...)` value list."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


def _check_key(key: str, selector: str) -> str:
    if not _KEY.match(key):
        raise ApiError.bad_request(f"unable to parse requirement: invalid label key {key!r} in selector {selector!r}")
    return key


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """Parse `a=b,c!=d,e in (f,g),h notin (i),j,!k` into requirements (all must match)."""
    if not selector:
        return []
    requirements = []
    for term in _split_top_level(selector):
        set_match = _SET_OP.match(term)
        if set_match:
            negated, key, op, raw_values = set_match.groups()
            if negated:
                raise ApiError.bad_request(f"unable to parse requirement: unexpected '!' in {term!r}")
            values = frozenset(v.strip() for v in raw_values.split(",") if v.strip())
            requirements.append(Requirement(_check_key(key, selector), op, values))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            requirements.append(Requirement(_check_key(key.strip(), selector), "!=", frozenset([value.strip()])))
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            requirements.append(Requirement(_check_key(key.strip(), selector), "=", frozenset([value.strip()])))
        elif term.startswith("!"):
            requirements.append(Requirement(_check_key(term[1:].strip(), selector), "!exists"))
        else:
            requirements.append(Requirement(_check_key(term, selector), "exists"))
    return requirements


def parse_field_selector(selector: str | None, allowed: frozenset[str], kind: str) -> list[tuple[str, str, str]]:
    """Parse `a.b=c,d!=e` into (path, op, value); unknown fields are refused as the real server does."""
    if not selector:
        return []
    terms = []
    for term in _split_top_level(selector):
        if "!=" in term:
            field, value = term.split("!=", 1)
            op = "!="
        elif "=" in term:
            field, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            op = "="
        else:
            raise ApiError.bad_request(f"invalid selector: {selector!r}; can't understand {term!r}")
        field = field.strip()
        if field not in allowed:
            raise ApiError.bad_request(f"field label not supported: {field}", kind=kind)
        terms.append((field, op, value.strip()))
    return terms


def _field_value(obj: dict, path: str) -> str:
    value: object = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def build_matcher(
    label_selector: str | None, field_selector: str | None, allowed_fields: frozenset[str], kind: str
) -> Callable[[dict], bool] | None:
    """One predicate over whole objects; None when nothing filters (the fast path for full lists)."""
    labels = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector, allowed_fields, kind)
    if not labels and not fields:
        return None

    def matches(obj: dict) -> bool:
        obj_labels = obj["metadata"].get("labels") or {}
        if not all(req.matches(obj_labels) for req in labels):
            return False
        return all((_field_value(obj, path) == value) == (op == "=") for path, op, value in fields)

    return matches
