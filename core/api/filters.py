"""How the API reads a query string: every value as the OpenAPI schema states it.

django-filter's backend, with booleans that refuse what is neither true nor false (the HTML select widget
django-filter uses reads anything else as "any", so `?ready=maybe` would list every node), numbers that name an
integer column refusing fractions (`?node=0.5`), and a parameter given empty refused unless it is text (`?until=`
was read as no filter); the query serializers of the other endpoints refuse empty values alike. And search,
`?search=` as DRF names it or `?q=` as the UI's search boxes name it, alike. The HTML lists share the FilterSets
and keep reading an empty field as "any": their forms send every field."""

import functools
from copy import copy

from django import forms
from django.db import models
from django_filters import BaseCSVFilter, BooleanFilter, CharFilter, MultipleChoiceFilter, NumberFilter
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.utils import get_model_field
from rest_framework import filters, serializers

TRUE, FALSE = frozenset({"true", "True"}), frozenset({"false", "False"})


class StrictBooleanField(forms.NullBooleanField):
    """true or false (left out: no filter; given empty: refused, refusing_empty); anything else is a 400."""

    def __init__(self, *args, **kwargs):
        kwargs["widget"] = forms.TextInput  # the raw value: django-filter's boolean widgets turn the unknown into None
        super().__init__(*args, **kwargs)

    def to_python(self, value):
        if value in (None, ""):
            return None
        if value in TRUE:
            return True
        if value in FALSE:
            return False
        raise forms.ValidationError("Use true or false.", code="invalid")

    def validate(self, value):
        pass


EMPTY = "Give a value, or leave the parameter out."


@functools.cache
def refusing_empty(field_class):
    """`field_class`, with a parameter given empty (`?until=`) refused; one left out still means no filter."""

    def clean(self, value):
        if value == "":
            raise forms.ValidationError(EMPTY, code="empty")
        return field_class.clean(self, value)

    return type(f"NonEmpty{field_class.__name__}", (field_class,), {"clean": clean})


def _names_integer_column(flt, model) -> bool:
    field = get_model_field(model, flt.field_name) if flt.field_name and not flt.method else None
    if isinstance(field, models.ForeignKey):
        field = field.target_field
    return isinstance(field, models.IntegerField | models.AutoField)


class FilterBackend(DjangoFilterBackend):
    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is None:
            return None
        # The filterset's own copies of its filters: the HTML forms built from the same class are left as they are.
        for flt in filterset.filters.values():
            if isinstance(flt, BooleanFilter):
                flt.field_class = StrictBooleanField
            elif isinstance(flt, NumberFilter) and _names_integer_column(flt, queryset.model):
                flt.field_class = forms.IntegerField  # the schema says integer (a column's or an id's type)
            if not isinstance(flt, CharFilter | MultipleChoiceFilter | BaseCSVFilter):  # text and lists may be empty
                flt.field_class = refusing_empty(flt.field_class)
            # A field the class's filter built before (the schema generator reads `.field`) was copied with it.
            flt.__dict__.pop("_field", None)
        return filterset


class QuerySerializer(serializers.Serializer):
    """The query of an endpoint without a FilterSet: a parameter given empty is refused unless the field is text
    (DRF reads a QueryDict as an HTML form, where an empty field means left out)."""

    def to_internal_value(self, data):
        empty = {
            name: [EMPTY]
            for name, field in self.fields.items()
            if data.get(name) == "" and not isinstance(field, serializers.CharField)
        }
        if empty:
            raise serializers.ValidationError(empty)
        return super().to_internal_value(data)


class SearchFilter(filters.SearchFilter):
    """DRF's search over a view's `search_fields`, reading `search` or else its alias `q`."""

    ALIAS = "q"

    def get_search_terms(self, request):
        if self.search_param not in request.query_params and self.ALIAS in request.query_params:
            alias = copy(self)
            alias.search_param = self.ALIAS
            return super(SearchFilter, alias).get_search_terms(request)
        return super().get_search_terms(request)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        if parameters:
            alias = dict(parameters[0], name=self.ALIAS, description=f"Alias of `{self.search_param}`.")
            parameters.append(alias)
        return parameters
