"""Page-number pagination with a client-chosen page size, capped so no request loads the whole fleet."""

from django.conf import settings
from rest_framework import pagination
from rest_framework.exceptions import ValidationError


class PageNumberPagination(pagination.PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = settings.TESSERA["API_MAX_PAGE_SIZE"]

    def get_page_size(self, request):
        """A page size that is no positive integer is a 400 (DRF would quietly use the default); a larger one than
        the cap gets the cap, as the schema says."""
        value = request.query_params.get(self.page_size_query_param)
        if value is None:
            return self.page_size
        digits = value.lstrip("0")
        if not value.isascii() or not value.isdigit() or not digits:
            raise ValidationError({self.page_size_query_param: ["A positive whole number."]})
        # More digits than the cap has: the cap, without reading a number Python may refuse to convert.
        cap = self.max_page_size
        return cap if len(digits) > len(str(cap)) else min(int(digits), cap)

    def get_page_number(self, request, paginator):
        """An empty or non-numeric page is a 400 (DRF would serve page 1); a page past the end stays DRF's 404."""
        value = request.query_params.get(self.page_query_param)
        if value is None:
            return 1
        if value not in self.last_page_strings and not (value.isascii() and value.isdigit()):
            raise ValidationError({self.page_query_param: ["A positive whole number."]})
        return value

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["minimum"] = 1
                parameter["description"] = (
                    f"Results per page: {self.page_size} unless given; a larger value than {self.max_page_size} gets "
                    f"{self.max_page_size}."
                )
            elif parameter["name"] == self.page_query_param:
                parameter["schema"]["minimum"] = 1
        return parameters
