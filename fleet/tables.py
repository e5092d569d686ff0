"""The node table as the node list and the overview show it: filtered on the server, paginated, swapped in place."""

from core.views import paginate
from fleet import selectors
from fleet.filtersets import NodeFilterSet

PAGE_SIZE = 50


def node_table(request) -> dict:
    """The table's context for the request's filters and page."""
    filterset = NodeFilterSet(request.GET, queryset=selectors.node_filter_base())
    return {
        "filterset": filterset,
        "filter_choices": selectors.node_filter_choices(),
        "page_obj": paginate(request, selectors.node_rows(filterset.qs), PAGE_SIZE),
        "is_filtered": selectors.is_filtered(request.GET),
        "table_url": request.path,
    }
