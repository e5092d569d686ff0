"""Kubernetes label selectors, parsed and matched in Python (pure: pools select nodes by the labels they report)."""

import re
from dataclasses import dataclass
from functools import lru_cache

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict) -> bool:
        present = self.key in labels
        if self.operator == "exists":
            return present
        if self.operator == "!exists":
            return not present
        if self.operator == "in":
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    parts, depth, current = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (p.strip() for p in parts) if p]


@lru_cache(maxsize=4096)
def parse_selector(selector: str) -> tuple[Requirement, ...]:
    """Parse `k=v, k!=v, k in (a,b), k notin (a), k, !k`; raises ValueError naming the bad term. Kept per selector
    (immutable results): checking a new pool against every other parses each of theirs again."""
    requirements = []
    for term in _split(selector or ""):
        if m := _SET_RE.match(term):
            values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
            requirements.append(Requirement(m.group(1), m.group(3), values))
        elif m := _EQ_RE.match(term):
            requirements.append(
                Requirement(m.group(1), "notin" if m.group(3) == "!=" else "in", frozenset([m.group(4)]))
            )
        elif m := _EXISTS_RE.match(term):
            requirements.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise ValueError(f"'{term}' is not a valid label selector term (expected k=v, k!=v, k in (a,b), k or !k)")
    return tuple(requirements)


def selector_matches(requirements: tuple[Requirement, ...], labels: dict) -> bool:
    """An empty selector matches nothing: a pool without a selector has explicit members only."""
    return bool(requirements) and all(r.matches(labels) for r in requirements)


ANY_VALUE = None  # in a witness: the key must be present, with any value its requirements allow


def common_labels(a: tuple[Requirement, ...], b: tuple[Requirement, ...]) -> dict[str, str | None] | None:
    """Labels a node would need to match both selectors, or None when no node can (they exclude each other).

    Decided per key, exactly: requirements on different keys never conflict, so the selectors can share a node
    unless, on some key, one needs it present and the other absent, or their allowed values have nothing in common.
    A key that needs only presence maps to ANY_VALUE; an empty selector matches nothing, so it shares nothing."""
    if not a or not b:
        return None
    by_key: dict[str, list[Requirement]] = {}
    for requirement in (*a, *b):
        by_key.setdefault(requirement.key, []).append(requirement)
    labels: dict[str, str | None] = {}
    for key, requirements in by_key.items():
        operators = {r.operator for r in requirements}
        if not operators & {"in", "exists"}:
            continue  # absent satisfies notin and !exists
        if "!exists" in operators:
            return None
        allowed = None
        for r in requirements:
            if r.operator == "in":
                allowed = r.values if allowed is None else allowed & r.values
        forbidden = frozenset().union(*(r.values for r in requirements if r.operator == "notin"))
        if allowed is None:
            labels[key] = ANY_VALUE  # label values are unbounded: some value avoids any finite forbidden set
            continue
        candidates = sorted(allowed - forbidden)
        if not candidates:
            return None
        labels[key] = candidates[0]
    return labels


def labels_text(labels: dict[str, str | None]) -> str:
    """A witness as a reader writes labels: `k=v`, or `k` alone where any value would do."""
    return ", ".join(key if value is ANY_VALUE else f"{key}={value}" for key, value in sorted(labels.items()))
