"""Inventory pages: clusters, pools, the node and GPU lists, and agent join tokens. Pages that compose other apps
(overview, node, GPU and pool pages) are in `console`."""

from datetime import timedelta

from django.contrib import messages
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role
from core.views import form_add_service_errors, paginate, redirect_after_change, render_table_page, role_required
from fleet import agent_credentials, selectors
from fleet.choices import ClusterDriver
from fleet.filtersets import GpuFilterSet
from fleet.forms import AgentJoinTokenForm
from fleet.models import AgentJoinToken, Cluster, Gpu, Node, PendingAgent
from fleet.tables import PAGE_SIZE, node_table


@role_required(Role.VIEWER)
@require_GET
@vary_on_headers("HX-Request")
def node_list(request):
    """Every node, filterable and paginated on the server; HTMX swaps only the table."""
    return render_table_page(request, "fleet/node_list.html", "node-table", node_table(request))


@role_required(Role.VIEWER)
@require_GET
@vary_on_headers("HX-Request")
def gpu_list(request):
    """Every GPU with its health and utilisation, filterable and paginated on the server."""
    filterset = GpuFilterSet(request.GET, queryset=selectors.gpu_filter_base())
    context = {
        "filterset": filterset,
        "filter_choices": selectors.gpu_filter_choices(),
        "page_obj": paginate(request, selectors.gpu_rows(filterset.qs), PAGE_SIZE),
        "is_filtered": selectors.is_filtered(request.GET),
        "table_url": request.path,
    }
    return render_table_page(request, "fleet/gpu_list.html", "gpu-table", context)


@role_required(Role.VIEWER)
@require_GET
def cluster_list(request):
    """Every cluster with its connection state and how many pools, nodes and GPUs it has."""
    return render(request, "fleet/cluster_list.html", {"clusters": selectors.cluster_rows()})


@role_required(Role.VIEWER)
@require_GET
def cluster_detail(request, pk):
    """One cluster: connection and last error, its pools, and the state of its nodes and GPUs."""
    cluster = get_object_or_404(Cluster.objects.with_counts(), pk=pk)
    context = {
        "cluster": cluster,
        "filter_query": f"cluster={cluster.pk}",
        "pools": selectors.pool_rows(cluster=cluster),
        "node_summary": selectors.node_state_summary(Node.objects.in_cluster(cluster)),
        "gpu_summary": selectors.gpu_summary(Gpu.objects.in_cluster(cluster)),
        "gpu_stacks": selectors.gpu_stack_summary(Node.objects.in_cluster(cluster)),
    }
    return render(request, "fleet/cluster_detail.html", context)


@role_required(Role.VIEWER)
@require_GET
def pool_list(request):
    """Every node pool with its cluster and member counts."""
    return render(request, "fleet/pool_list.html", {"pools": selectors.pool_rows()})


# --- agents --------------------------------------------------------------------------------------------------------

JOIN_TOKENS_SHOWN = 100


def _join_token_page(request, form, *, created=None, status=200):
    tokens = list(
        AgentJoinToken.objects.select_related("cluster", "created_by").order_by("-created_at", "-pk")[
            :JOIN_TOKENS_SHOWN
        ]
    )
    now = timezone.now()
    for token in tokens:
        token.state = _token_state(token, now)
    context = {
        "form": form,
        "tokens": tokens,
        "pending_agents": selectors.pending_agents(),
        "created": created,
        "server_url": request.build_absolute_uri("/").rstrip("/"),
        "agent_clusters": Cluster.objects.filter(driver=ClusterDriver.AGENT).count(),
        "agent_nodes": Node.objects.live().filter(cluster__driver=ClusterDriver.AGENT).count(),
        "stale_agents": Node.objects.live().filter(cluster__driver=ClusterDriver.AGENT).stale(now).count(),
    }
    return render(request, "fleet/agent_token_list.html", context, status=status)


def _token_state(token: AgentJoinToken, now) -> str:
    if token.revoked_at:
        return "revoked"
    if token.expires_at <= now:
        return "expired"
    if token.max_uses is not None and token.uses >= token.max_uses:
        return "used up"
    return "active"


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def agent_token_list(request):
    """Join tokens of agent clusters (admins): the list never shows a token; creating one shows it this once,
    with the command lines that start an agent with it."""
    if request.method != "POST":
        return _join_token_page(request, AgentJoinTokenForm())
    form = AgentJoinTokenForm(request.POST)
    if not form.is_valid():
        return _join_token_page(request, form, status=400)
    data = form.cleaned_data
    try:
        token, plain = agent_credentials.agent_join_token_create(
            actor=Actor.for_user(request.user),
            cluster=data["cluster"],
            name=data["name"],
            expires_at=timezone.now() + timedelta(hours=data["expires_in_hours"]),
            max_uses=data["max_uses"],
            node_name_pattern=data["node_name_pattern"],
            service_account=data["service_account"],
        )
    except ApplicationError as exc:
        form_add_service_errors(form, exc, fields=AgentJoinTokenForm.SERVICE_FIELDS, default="name")
        return _join_token_page(request, form, status=exc.status)
    # Rendered, not redirected: the plain token exists only in this response (never stored, never in a session).
    response = _join_token_page(request, AgentJoinTokenForm(), created={"token": token, "plain": plain}, status=201)
    response["Cache-Control"] = "no-store"
    return response


@role_required(Role.ADMIN)
@require_POST
def agent_token_revoke(request, pk):
    """Refuse further registrations with the token; nodes that registered with it keep their credentials."""
    token = get_object_or_404(AgentJoinToken, pk=pk)
    try:
        agent_credentials.agent_join_token_revoke(actor=Actor.for_user(request.user), token=token)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Join token {token.name} revoked; nodes that joined with it keep running.")
    return redirect_after_change(request, reverse("fleet:agent_token_list"))


@role_required(Role.ADMIN)
@require_POST
def pending_agent_decide(request, pk, approve):
    """Approve or reject an agent's request to register an existing node without its credential."""
    pending = get_object_or_404(PendingAgent.objects.select_related("node"), pk=pk)
    try:
        agent_credentials.pending_agent_decide(actor=Actor.for_user(request.user), pending=pending, approve=approve)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        done = "approved: it collects its credential at its next call" if approve else "rejected"
        messages.success(request, f"Agent request {pending.fingerprint} for node {pending.node.name} {done}.")
    return redirect_after_change(request, reverse("fleet:agent_token_list"))


@role_required(Role.ADMIN)
@require_POST
def node_agent_revoke(request, pk):
    """Revoke the node's agent credential: its agent stops at its next call until registered again."""
    node = get_object_or_404(Node, pk=pk)
    try:
        agent_credentials.node_agent_revoke(actor=Actor.for_user(request.user), node=node)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Agent credential of {node.name} revoked; the agent stops at its next call.")
    return redirect_after_change(request, node.get_absolute_url())
