"""Hypothesis strategies of the JSON values of agent/protocol.py's messages, read from their type hints: values the
contract accepts (bounds included), and with `odd`, anything a hostile agent could put at any field as well."""

import dataclasses
import types
import typing

from hypothesis import strategies as st

from agent.protocol import REFUSED_CATEGORIES, Range, Text

# What a field of any type may receive from an agent that does not follow the contract.
ODD_VALUES = st.one_of(
    st.sampled_from([2**63, -(2**63) - 5, 2**64, 10**30, -1, 0.5, 1e308, True, "1", None, [], {}]),
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["\u202e", "a\x00b", "\x1b[2J", "line\nbreak", "\u2028", "x" * 1_000, "y" * 100_001]),
)
# Characters a bounded string may have (surrogates cannot travel in UTF-8 JSON).
ALLOWED = st.characters(exclude_categories=(*REFUSED_CATEGORIES, "Cs"))


def json_values(tp, *, odd: bool = False) -> st.SearchStrategy:
    """JSON values of a protocol type (a message: its dict, as `to_dict()` makes it)."""
    strategy = _accepted(tp, odd)
    return st.one_of(strategy, ODD_VALUES) if odd else strategy


def _accepted(tp, odd: bool) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(json_values(arg, odd=odd) for arg in typing.get_args(tp)))
    if origin is typing.Annotated:
        inner, bounds = typing.get_args(tp)
        return _bounded(inner, bounds)
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(tp))
    if origin is tuple:
        return st.lists(json_values(typing.get_args(tp)[0], odd=odd), max_size=3)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return st.fixed_dictionaries({f.name: json_values(hints[f.name], odd=odd) for f in dataclasses.fields(tp)})
    return {
        type(None): st.none(),
        bool: st.booleans(),
        dict: st.dictionaries(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=2), max_size=2),
        str: st.text(max_size=12),
    }[tp]


def _bounded(inner: type, bounds: Range | Text) -> st.SearchStrategy:
    if isinstance(bounds, Text):
        longest = st.just("z" * bounds.max_length) if bounds.max_length <= 1_000 else st.nothing()
        return st.text(ALLOWED, max_size=min(bounds.max_length, 12)) | longest
    if inner is int:
        return st.integers(min_value=bounds.low, max_value=bounds.high)
    return st.floats(min_value=bounds.low, max_value=bounds.high, allow_nan=False) | st.integers(
        min_value=bounds.low, max_value=bounds.high
    )
