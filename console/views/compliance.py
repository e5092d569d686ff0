"""QoS compliance pages: every pool's last check against the policy in force now (scheduling), offending pods
grouped by node, kubelet mismatches, and the admission objects enforcing it (worker)."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.roles import Role
from core.views import redirect_after_change, role_required
from fleet.models import Node, NodePool
from scheduling.selectors import pool_states
from scheduling.services import pool_compliance_check as check_pool_now
from sharing import display
from sharing import selectors as sharing_selectors
from sharing.models import QoSComplianceReport
from worker.admission import pool_admission_views

VIOLATIONS_SHOWN = 500


def _offenders_by_node(violations: list[dict], node_ids: dict[str, int]) -> list[dict]:
    """Violations as nodes → pods → the rules each breaks (nodes and pods sorted by name)."""
    nodes: dict[str, dict] = {}
    for v in violations:
        node = nodes.setdefault(v["node"], {"name": v["node"], "pk": node_ids.get(v["node"]), "pods": {}})
        pod = node["pods"].setdefault((v["namespace"], v["name"]), {"namespace": v["namespace"], "name": v["name"]})
        pod.setdefault("rules", []).append(
            {"rule": v["rule"], "label": display.RULE_LABELS.get(v["rule"], v["rule"]), "message": v["message"]}
        )
    return [
        {**node, "pods": [node["pods"][key] for key in sorted(node["pods"])]}
        for node in sorted(nodes.values(), key=lambda n: n["name"])
    ]


@role_required(Role.VIEWER)
@require_GET
def compliance_list(request):
    """Every pool's last QoS compliance check: the policy in force now, when it was checked, what it found."""
    pools = list(NodePool.objects.select_related("cluster", "qos_compliance__policy").order_by("cluster__name", "name"))
    states = pool_states([p.pk for p in pools])
    unchecked = sharing_selectors.pools_without_pods_to_check(pools)
    rows, without = [], 0
    for pool in pools:
        report = getattr(pool, "qos_compliance", None)
        state = states[pool.pk]
        if state.qos_policy is None and report is None:
            without += 1
            continue
        pool.state, pool.report = state, report
        pool.stale_policy = report is not None and report.policy_id != getattr(state.qos_policy, "pk", None)
        pool.no_pods_here = pool.pk in unchecked
        rows.append(pool)
    totals = {
        "violations": sum(p.report.violation_count for p in rows if p.report),
        "pools_violating": sum(1 for p in rows if p.report and p.report.violation_count),
        "mismatches": sum(len(p.report.kubelet_mismatches) for p in rows if p.report),
        "pods": sum(p.report.pods_checked for p in rows if p.report),
    }
    context = {"pools": rows, "without_policy": without, "totals": totals}
    return render(request, "console/compliance_list.html", context)


def _compliance_context(pool: NodePool) -> dict:
    state = pool_states([pool.pk])[pool.pk]
    report = QoSComplianceReport.objects.filter(pool=pool).select_related("policy").first()
    admission = pool_admission_views([pool])
    context = {"pool": pool, "state": state, "report": report, "admission": admission[0] if admission else None}
    context["no_pods_here"] = bool(sharing_selectors.pools_without_pods_to_check([pool]))
    if state.qos_policy is not None:
        context["rules"] = display.qos_rule_summary(state.qos_policy)
    if report is not None:
        violations = report.violations[:VIOLATIONS_SHOWN]
        names = {v["node"] for v in violations} | {m["node"] for m in report.kubelet_mismatches}
        node_ids = dict(Node.objects.filter(cluster_id=pool.cluster_id, name__in=names).values_list("name", "pk"))
        context.update(
            offenders=_offenders_by_node(violations, node_ids),
            mismatches=[{**m, "pk": node_ids.get(m["node"])} for m in report.kubelet_mismatches],
            by_rule=display.count_by_rule(report.violations),
            pods_violating=len({(v["namespace"], v["name"]) for v in report.violations}),
            truncated=len(report.violations) > VIOLATIONS_SHOWN,
            stale_policy=report.policy_id != getattr(state.qos_policy, "pk", None),
        )
    return context


@role_required(Role.VIEWER)
@require_GET
def pool_compliance(request, pk):
    """One pool against its QoS policy: offending pods grouped by node with the rule each breaks, and kubelets that
    run other policies than it expects."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    return render(request, "console/pool_compliance.html", _compliance_context(pool))


@role_required(Role.OPERATOR)
@require_POST
def pool_compliance_check(request, pk):
    """Check the pool now (the periodic check runs every few minutes) and show the result."""
    pool = get_object_or_404(NodePool, pk=pk)
    found = check_pool_now(pool.pk)
    messages.success(request, f"Pool {pool.name} checked: {found} violation{'s' if found != 1 else ''}.")
    return redirect_after_change(request, reverse("console:pool_compliance", args=[pool.pk]))
