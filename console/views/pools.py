"""A pool's page: how it selects nodes, the profile and QoS policy in force now and why, its nodes and GPUs."""

from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from core.roles import Role
from core.views import role_required
from fleet import selectors
from fleet.models import Gpu, Node, NodePool
from scheduling.selectors import pool_states
from sharing.models import QoSComplianceReport


@role_required(Role.VIEWER)
@require_GET
def pool_detail(request, pk):
    """One pool: how it selects nodes, its profile and QoS policy now, and the state of its nodes and GPUs."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    context = {
        "pool": pool,
        "state": pool_states([pool.pk])[pool.pk],
        "qos_report": QoSComplianceReport.objects.filter(pool=pool).first(),
        "filter_query": f"pool={pool.pk}",
        "node_summary": selectors.node_state_summary(Node.objects.in_pool(pool)),
        "gpu_summary": selectors.gpu_summary(Gpu.objects.in_pool(pool)),
    }
    return render(request, "console/pool_detail.html", context)
