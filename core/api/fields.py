"""Fields shared by every app's serializers: links between API objects (a neighbour is written as its id and read as
{"id", "name", "url"}) and the bounds of integer columns."""

from django.db import connection
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import build_basic_type
from drf_spectacular.types import OpenApiTypes
from rest_framework import serializers
from rest_framework.reverse import reverse


def ref(pk: int, name: str, url: str) -> dict:
    """The one shape of a link to a neighbour, built here for every serializer and for the row-based lists."""
    return {"id": pk, "name": name, "url": url}


def ref_to(obj, view_name: str, request) -> dict:
    """A link to a model instance; objects without a name (a GPU) show their string form, e.g. node-7/gpu3."""
    url = reverse(view_name, kwargs={"pk": obj.pk}, request=request)
    return ref(obj.pk, getattr(obj, "name", None) or str(obj), url)


class RefSerializer(serializers.Serializer):
    """Documents the shape of `ref()` in the OpenAPI schema (component `Ref`)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    url = serializers.URLField()


class RefField(serializers.PrimaryKeyRelatedField):
    """A related object as a link clients can follow; on input, its id."""

    def __init__(self, view_name: str, **kwargs):
        self.view_name = view_name
        super().__init__(**kwargs)

    def use_pk_only_optimization(self):
        return False

    def to_representation(self, value):
        return ref_to(value, self.view_name, self.context.get("request"))


class RefFieldSchema(OpenApiSerializerFieldExtension):
    """An integer id in request bodies, a `Ref` object in responses."""

    target_class = RefField

    def map_serializer_field(self, auto_schema, direction):
        if direction == "request":
            return build_basic_type(OpenApiTypes.INT)
        return auto_schema.resolve_serializer(RefSerializer, direction).ref


def db_max_value(model, field_name: str) -> int | None:
    """The largest value the database column of an integer model field holds: the max_value of a plain serializer
    field that feeds it, so an out-of-range number is a 400 and not an OverflowError (a ModelSerializer's fields get
    it from the model field's own validators)."""
    field = model._meta.get_field(field_name)
    return connection.ops.integer_field_range(field.get_internal_type())[1]
