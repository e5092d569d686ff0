"""A JSON Schema check of the keywords the document schema uses (type, enum, const, required, properties,
additionalProperties, propertyNames, items, bounds, pattern, local $ref, allOf, if/then), with no dependency: the
client stays light. The server checks the same schema with the `jsonschema` library; the messages differ, the
verdicts do not (tests/manifests/test_client.py)."""

import re

_TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _is(value, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def _equal(a, b) -> bool:
    """JSON equality: true is not 1."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if ref:
        target = root
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        return {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
    return schema


def validate(value, schema: dict, root: dict | None = None, path: tuple = ()) -> list[tuple[tuple, str]]:
    """Every (path, message) where `value` breaks `schema`; an unknown field is reported at its own path."""
    root = root if root is not None else schema
    schema = _resolve(schema, root)
    problems: list[tuple[tuple, str]] = []
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        if not any(_is(value, name) for name in names):
            return [(path, f"{value!r} is not of type {' or '.join(names)}.")]
    if "const" in schema and not _equal(value, schema["const"]):
        return [(path, f"Must be {schema['const']!r}.")]
    if "enum" in schema and not any(_equal(value, option) for option in schema["enum"]):
        return [(path, f"{value!r} is not one of {', '.join(repr(e) for e in schema['enum'])}.")]
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            problems.append(
                (path, "Must not be empty." if not value else f"At least {schema['minLength']} characters.")
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append((path, f"At most {schema['maxLength']} characters."))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            problems.append((path, f"{value!r} does not match {schema['pattern']}."))
    if _is(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append((path, f"At least {schema['minimum']}."))
        if "maximum" in schema and value > schema["maximum"]:
            problems.append((path, f"At most {schema['maximum']}."))
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            problems.append((path, f"At least {schema['minItems']} item(s)."))
        if "items" in schema:
            for i, item in enumerate(value):
                problems += validate(item, schema["items"], root, (*path, i))
    if isinstance(value, dict):
        problems += _object(value, schema, root, path)
    for part in schema.get("allOf", []):
        condition = part.get("if")
        if condition is not None and validate(value, condition, root, path):
            continue
        problems += validate(value, part.get("then", part) if condition is not None else part, root, path)
    return problems


def _object(value: dict, schema: dict, root: dict, path: tuple) -> list[tuple[tuple, str]]:
    problems = []
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            problems.append((path, f"Missing required field {name!r}."))
    names = schema.get("propertyNames", {})
    for name, item in value.items():
        if not isinstance(name, str):
            problems.append(((*path, name), f"Field names are strings, not {name!r}."))
            continue
        if "pattern" in names and not re.search(names["pattern"], name):
            problems.append(((*path, name), f"{name!r} does not match {names['pattern']}."))
        if name in properties:
            problems += validate(item, properties[name], root, (*path, name))
        elif schema.get("additionalProperties") is False:
            problems.append(((*path, name), f"Unknown field {name!r}."))
        elif isinstance(schema.get("additionalProperties"), dict):
            problems += validate(item, schema["additionalProperties"], root, (*path, name))
    return problems
