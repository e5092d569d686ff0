"""Fleet pages: overview, filterable node and GPU tables, and object pages for clusters, pools, nodes and GPUs."""

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from core.roles import Role, has_role
from fleet import selectors
from fleet.filtersets import GpuFilterSet, NodeFilterSet
from fleet.models import Cluster, Gpu, Node, NodePool
from scheduling.selectors import desired_vs_observed, upcoming_transitions
from sharing.models import NodePin, SharingProfile
from worker.models import NodeChange

PAGE_SIZE = 50
NODE_CHANGES = 20
UPCOMING_HOURS = 48


def _page(request, rows):
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    page.elided_range = list(page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1))
    return page


def _node_table(request) -> dict:
    filterset = NodeFilterSet(request.GET, queryset=selectors.node_filter_base())
    return {
        "filterset": filterset,
        "filter_choices": selectors.node_filter_choices(),
        "page_obj": _page(request, selectors.node_rows(filterset.qs)),
        "is_filtered": selectors.is_filtered(request.GET),
    }


def _wants_fragment(request) -> bool:
    # htmx restoring a page missing from its history cache asks with HX-Request too, but needs the whole page.
    return bool(request.htmx) and not request.htmx.history_restore_request


def _render_table(request, template: str, partial: str, context: dict):
    return render(request, f"{template}#{partial}" if _wants_fragment(request) else template, context)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def overview(request):
    """The fleet at a glance: totals, what needs attention, and the node table (filtered in place over HTMX)."""
    context = _node_table(request)
    context["table_url"] = request.path
    if not _wants_fragment(request):
        context["stats"] = selectors.fleet_overview()
        context["upcoming"] = upcoming_transitions(hours=UPCOMING_HOURS)
        context["upcoming_hours"] = UPCOMING_HOURS
    return _render_table(request, "fleet/overview.html", "node-table", context)


@login_required
@require_GET
def overview_stats(request):
    """The overview's totals, charts and attention list on their own, polled by the overview to stay live."""
    return render(request, "fleet/overview.html#overview-stats", {"stats": selectors.fleet_overview()})


@login_required
@require_GET
@vary_on_headers("HX-Request")
def node_list(request):
    """Every node, filterable and paginated on the server; HTMX swaps only the table."""
    context = _node_table(request)
    context["table_url"] = request.path
    return _render_table(request, "fleet/node_list.html", "node-table", context)


@login_required
@require_GET
def node_detail(request, pk):
    """One node as it last reported, beside what it should be (pin, schedule or pool); its change history and GPUs."""
    node = get_object_or_404(selectors.node_detail_queryset(), pk=pk)
    context = {
        "node": node,
        "gpus": selectors.node_gpus(node),
        "desired": desired_vs_observed([node])[0],
        "pin": NodePin.objects.filter(node=node).select_related("profile", "pinned_by").first(),
        "changes": list(NodeChange.objects.filter(node=node).select_related("rollout").order_by("-pk")[:NODE_CHANGES]),
    }
    if has_role(request.user, Role.OPERATOR):
        context["pin_profiles"] = SharingProfile.objects.only("pk", "name", "mode")
    return render(request, "fleet/node_detail.html", context)


@login_required
@require_GET
def node_state(request, pk):
    """The node page's state section alone, polled so a rollout's progress shows without reloading."""
    node = get_object_or_404(selectors.node_detail_queryset(), pk=pk)
    return render(request, "fleet/node_detail.html#node-state", {"node": node})


@login_required
@require_GET
@vary_on_headers("HX-Request")
def gpu_list(request):
    """Every GPU with its health and utilisation, filterable and paginated on the server."""
    filterset = GpuFilterSet(request.GET, queryset=selectors.gpu_filter_base())
    context = {
        "filterset": filterset,
        "filter_choices": selectors.gpu_filter_choices(),
        "page_obj": _page(request, selectors.gpu_rows(filterset.qs)),
        "is_filtered": selectors.is_filtered(request.GET),
        "table_url": request.path,
    }
    return _render_table(request, "fleet/gpu_list.html", "gpu-table", context)


@login_required
@require_GET
def gpu_detail(request, pk):
    """One GPU: every observed field, its MIG layout drawn large, and its MIG devices with who uses them."""
    gpu = get_object_or_404(selectors.gpu_detail_queryset(), pk=pk)
    devices = list(gpu.mig_devices.all())
    context = {"gpu": gpu, "node": gpu.node, "mig_devices": devices, "mig_layout": selectors.mig_layout(gpu, devices)}
    return render(request, "fleet/gpu_detail.html", context)


@login_required
@require_GET
def cluster_list(request):
    """Every cluster with its connection state and how many pools, nodes and GPUs it has."""
    return render(request, "fleet/cluster_list.html", {"clusters": selectors.cluster_rows()})


@login_required
@require_GET
def cluster_detail(request, pk):
    """One cluster: connection and last error, its pools, and the state of its nodes and GPUs."""
    cluster = get_object_or_404(Cluster, pk=pk)
    context = {
        "cluster": cluster,
        "filter_query": f"cluster={cluster.pk}",
        "pools": selectors.pool_rows(cluster=cluster),
        "node_summary": selectors.node_state_summary(Node.objects.in_cluster(cluster)),
        "gpu_summary": selectors.gpu_summary(Gpu.objects.in_cluster(cluster)),
    }
    return render(request, "fleet/cluster_detail.html", context)


@login_required
@require_GET
def pool_list(request):
    """Every node pool with its cluster and member counts."""
    return render(request, "fleet/pool_list.html", {"pools": selectors.pool_rows()})


@login_required
@require_GET
def pool_detail(request, pk):
    """One pool: how it selects nodes, and the state of its nodes and GPUs."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    context = {
        "pool": pool,
        "filter_query": f"pool={pool.pk}",
        "node_summary": selectors.node_state_summary(Node.objects.in_pool(pool)),
        "gpu_summary": selectors.gpu_summary(Gpu.objects.in_pool(pool)),
    }
    return render(request, "fleet/pool_detail.html", context)
