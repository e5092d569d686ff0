"""The filter backends of every list: django-filter's, with booleans that refuse what is neither true nor false (the
HTML select widget django-filter uses reads anything else as "any", so `?ready=maybe` would list every node); and
search, `?search=` as DRF names it or `?q=` as the UI's search boxes name it, alike."""

from copy import copy

from django import forms
from django_filters import BooleanFilter
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import filters

TRUE, FALSE = frozenset({"true", "True"}), frozenset({"false", "False"})


class StrictBooleanField(forms.NullBooleanField):
    """true or false; empty means no filter; anything else is a field error, so a 400."""

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


class FilterBackend(DjangoFilterBackend):
    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is not None:
            for flt in filterset.filters.values():
                if isinstance(flt, BooleanFilter):
                    # The filterset's own copy: the HTML forms built from the same class keep their select.
                    flt.field_class = StrictBooleanField
        return filterset


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
