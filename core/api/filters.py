"""The filter backend of every list: django-filter's, with booleans that refuse what is neither true nor false (the
HTML select widget django-filter uses reads anything else as "any", so `?ready=maybe` would list every node)."""

from django import forms
from django_filters import BooleanFilter
from django_filters.rest_framework import DjangoFilterBackend

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
