"""JSON bodies are taken at their JSON type, as the OpenAPI schema states them: DRF's fields coerce (`"node_selector":
0` stored as "0", `"persistence_mode": 0` as false, `"count": "3"` as 3, `true` as the id 1), which the schema
refuses and a client's bug hides behind. Installed once for every serializer (core.apps), on the fields' own
`to_internal_value`, so declared fields, model fields and their subclasses (EmailField, URLField…) all follow it.

Only JSON: a form or a query string (a QueryDict, every value a string) keeps DRF's reading."""

from rest_framework import fields, relations
from rest_framework.utils import html


def _from_json(field) -> bool:
    data = getattr(field.root, "initial_data", None)
    return data is not None and not html.is_html_input(data)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# field class -> (what JSON it takes, its error key in DRF's messages)
RULES = (
    (fields.CharField, lambda value: isinstance(value, str), "invalid"),
    (fields.BooleanField, lambda value: isinstance(value, bool), "invalid"),
    (fields.IntegerField, _is_number, "invalid"),
    (fields.FloatField, _is_number, "invalid"),
    (relations.PrimaryKeyRelatedField, _is_number, "incorrect_type"),
)


def _strict(cls, takes, error: str) -> None:
    lenient = cls.to_internal_value

    def to_internal_value(self, data):
        if not takes(data) and _from_json(self):
            self.fail(error, data_type=type(data).__name__)
        return lenient(self, data)

    to_internal_value.lenient = lenient
    cls.to_internal_value = to_internal_value


def install() -> None:
    for cls, takes, error in RULES:
        if not hasattr(cls.to_internal_value, "lenient"):
            _strict(cls, takes, error)
