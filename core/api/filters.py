"""Search on API lists: `?search=` as DRF names it, and `?q=` as the UI's search boxes name it, alike."""

from copy import copy

from rest_framework import filters


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
