"""JSON bodies for every endpoint: DRF's parser, with a nesting depth limit."""

from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_DEPTH = 100  # deeper than any body Tessera accepts; json.load itself stops near Python's recursion limit
TOO_DEEP = f"JSON parse error - nested deeper than {MAX_DEPTH} levels."


def nesting_depth(data) -> int:
    """How deep lists and objects nest in parsed JSON (0 for a scalar), without recursion; stops past MAX_DEPTH."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


class JSONParser(parsers.JSONParser):
    """The default parser of the API: a body nested beyond MAX_DEPTH is a 400, never a RecursionError's 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(TOO_DEEP) from None
        if nesting_depth(data) > MAX_DEPTH:
            raise ParseError(TOO_DEEP)
        return data
