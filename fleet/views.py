"""Fleet pages: overview, filterable node and GPU tables, object pages for clusters, pools, nodes and GPUs, and
the agents' join tokens."""

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Max, Q, Subquery, Sum, Value
from django.shortcuts import get_object_or_404, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role, has_role
from core.views import form_add_service_errors, redirect_after_change, role_required
from fleet import agent_credentials, selectors
from fleet.choices import ClusterDriver
from fleet.filtersets import GpuFilterSet, NodeFilterSet
from fleet.forms import AgentJoinTokenForm
from fleet.models import AgentCredential, AgentJoinToken, Cluster, Gpu, Node, NodePool
from fleet.querysets import agent_stale_cutoff
from fleet.selectors import gpu_events, node_agent_credential
from scheduling.selectors import desired_vs_observed, pool_states, upcoming_transitions
from sharing.forms import QoSPolicyForm
from sharing.models import NodePin, QoSComplianceReport, SharingProfile
from sharing.qos import DIFFERS, SettingCheck, SettingsComparison, compare_node_settings
from sharing.services import KUBELET_SETTINGS
from worker.models import NodeChange

PAGE_SIZE = 50
NODE_CHANGES = 20
GPU_EVENTS = 50
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


def _overview_stats() -> dict:
    """The fleet's totals, plus QoS policy violations and stale agents for the attention list."""
    stats = selectors.fleet_overview()
    # One more query for all four (the overview is polled): report totals ride along as scalar subqueries.
    reports = QoSComplianceReport.objects.order_by().annotate(one=Value(1)).values("one")
    agent = Q(cluster__driver=ClusterDriver.AGENT)
    extra = Node.objects.live().aggregate(
        agent_nodes=Count("pk", filter=agent),
        stale_agents=Count("pk", filter=agent & Q(pk__in=Node.objects.stale(stats["now"]).values("pk"))),
        policy_violations=Max(Subquery(reports.annotate(n=Sum("violation_count")).values("n"))),
        pools_violating=Max(Subquery(reports.annotate(n=Count("pk", filter=Q(violation_count__gt=0))).values("n"))),
    )
    stats.update(extra, agent_stale_seconds=3 * agent_credentials.agent_interval_seconds())
    stats["policy_violations"] = extra["policy_violations"] or 0
    stats["needs_attention"] += stats["policy_violations"]
    return stats


def _qos_rows(policy, comparison: SettingsComparison | None = None) -> list[dict]:
    """The policy's GPU settings and host tuning as rows of label, value with its unit, and scope; with a comparison
    (agent nodes), beside each what the node runs and whether that matches."""
    checks = {(c.section, c.name): c for c in comparison.checks} if comparison else {}
    rows = []
    for section, settings in policy.node_settings().items():
        for name in settings:
            row = {
                "label": QoSPolicyForm.base_fields[name].label,
                "value": QoSPolicyForm.setting_display(policy, name),
                "scope": "GPU" if section == "gpu" else "host",
            }
            if (section, name) in checks:
                row.update(_observed_row(checks[section, name]))
            rows.append(row)
    return rows


def _observed_row(check: SettingCheck) -> dict:
    """What the node runs for one setting, in words: its value(s), on how many GPUs, and where it comes from."""
    values = [(QoSPolicyForm.value_display(check.name, value), count) for value, count in check.observed]
    if check.section == "host" or check.agent_record:
        observed = values[0][0] if values else ""
        detail = ""
        if check.agent_record and values:
            detail = "as the agent set it: NVML cannot read it back"
        elif check.agent_record:
            detail = (
                "the config the agent applied leaves it as it is"
                if check.status == DIFFERS
                else "NVML cannot read it back, and the agent reported no QoS settings applied"
            )
        return {"status": check.status, "observed": observed, "detail": detail}
    if not check.gpus:
        return {"status": check.status, "observed": "", "detail": "no GPUs reported"}
    # Nothing read on any GPU: empty (the row says not reported); one value on every GPU: that value alone.
    parts = values + ([("not reported", check.gpus_unreported)] if values and check.gpus_unreported else [])
    if len(parts) == 1:
        observed = parts[0][0]
    else:
        observed = ", ".join(f"{value} ({count} GPU{pluralize(count)})" for value, count in parts)
    gpus = f"{check.gpus} GPU{pluralize(check.gpus)}"
    if check.gpus == 1:
        detail = ""  # nothing to count on a node with one GPU
    elif check.gpus_differ == check.gpus:
        detail = f"all {gpus} differ"
    elif check.gpus_differ:
        detail = f"{check.gpus_differ} of {gpus} differ{'s' if check.gpus_differ == 1 else ''}"
    elif check.gpus_unreported:
        detail = f"{check.gpus_unreported} of {gpus} not reported"
    else:
        detail = f"all {gpus}"
    return {"status": check.status, "observed": observed, "detail": detail}


def _agent_credential(node: Node) -> AgentCredential | None:
    """The node's active agent credential, else its last revoked one; none read for nodes no agent ever ran on."""
    if node.cluster.driver != ClusterDriver.AGENT and not node.agent_version:
        return None
    return node_agent_credential(node) or AgentCredential.objects.filter(node=node).select_related("join_token").first()


def _node_qos(node: Node, gpus: list) -> dict:
    """The node's QoS policy (from its pool or schedule window) with its node settings and kubelet expectations beside
    what the node runs; agent nodes apply the settings and report them, others do not."""
    # A node's QoS policy always comes from its pool (a pin changes only its profile): desired_state without the pins.
    policy = pool_states([node.pool_id])[node.pool_id].qos_policy if node.pool_id else None
    qos = {"policy": policy, "agent_driven": node.cluster.driver == ClusterDriver.AGENT}
    if policy is None:
        return qos
    kubelet = node.kubelet_config or {}
    desired, comparison = policy.node_settings(), None
    if qos["agent_driven"] and (desired["gpu"] or desired["host"]):
        comparison = qos["comparison"] = compare_node_settings(
            desired, host=node.host_settings, gpus=[g.settings for g in gpus], agent_record=node.agent_node_settings
        )
    qos.update(
        settings=_qos_rows(policy, comparison),
        kubelet=[
            {"setting": key, "expected": getattr(policy, field), "actual": kubelet.get(key)}
            for field, key in KUBELET_SETTINGS
            if getattr(policy, field)
        ],
    )
    report = QoSComplianceReport.objects.filter(pool_id=node.pool_id).only("checked_at", "violations").first()
    if report is not None:
        qos["report"] = report
        qos["violations"] = [v for v in report.violations if v["node"] == node.name]
    return qos


@login_required
@require_GET
@vary_on_headers("HX-Request")
def overview(request):
    """The fleet at a glance: totals, what needs attention, and the node table (filtered in place over HTMX)."""
    context = _node_table(request)
    context["table_url"] = request.path
    if not _wants_fragment(request):
        context["stats"] = _overview_stats()
        context["upcoming"] = upcoming_transitions(hours=UPCOMING_HOURS)
        context["upcoming_hours"] = UPCOMING_HOURS
    return _render_table(request, "fleet/overview.html", "node-table", context)


@login_required
@require_GET
def overview_stats(request):
    """The overview's totals, charts and attention list on their own, polled by the overview to stay live."""
    return render(request, "fleet/overview.html#overview-stats", {"stats": _overview_stats()})


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
    gpus = selectors.node_gpus(node)
    context = {
        "node": node,
        "gpus": gpus,
        "desired": desired_vs_observed([node])[0],
        "pin": NodePin.objects.filter(node=node).select_related("profile", "pinned_by").first(),
        "changes": list(NodeChange.objects.filter(node=node).select_related("rollout").order_by("-pk")[:NODE_CHANGES]),
        "qos": _node_qos(node, gpus),
        "credential": _agent_credential(node),
        "agent_stale": node.agent_last_seen_at is None or node.agent_last_seen_at < agent_stale_cutoff(),
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
    context = {
        "gpu": gpu,
        "node": gpu.node,
        "mig_devices": devices,
        "mig_layout": selectors.mig_layout(gpu, devices),
        "events": gpu_events(gpu, limit=GPU_EVENTS),
    }
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
    return render(request, "fleet/pool_detail.html", context)


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
        )
    except ApplicationError as exc:
        form_add_service_errors(form, exc, fields=AgentJoinTokenForm.SERVICE_FIELDS)
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
