"""Page-number pagination with a client-chosen page size, capped so no request loads the whole fleet."""

from django.conf import settings
from rest_framework import pagination


class PageNumberPagination(pagination.PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = settings.TESSERA["API_MAX_PAGE_SIZE"]
