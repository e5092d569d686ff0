"""The overview: the fleet's totals, what needs attention (from every app), upcoming changes and the node table."""

from django.db.models import Count, Max, Q, Subquery, Sum, Value
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from console.demo_schedule import first_look
from core.embedded import children_status
from core.roles import Role
from core.views import render_table_page, role_required, wants_fragment
from fleet import agent_credentials, selectors
from fleet.choices import ClusterDriver
from fleet.models import Node
from fleet.querysets import stale_q
from fleet.tables import node_table
from scheduling.selectors import upcoming_transitions
from sharing.models import QoSComplianceReport
from worker.selectors import failed_nodes_q, next_retry_at_subquery, stuck_nodes_q

UPCOMING_HOURS = 48
UPCOMING_PER_SCHEDULE = 6  # a schedule switching often (the demo's) leaves room for the others; its page has all


def _first_of_each(transitions) -> list:
    """The first UPCOMING_PER_SCHEDULE transitions of each schedule, in time order."""
    seen: dict[int, int] = {}
    kept = []
    for t in transitions:
        seen[t.schedule.pk] = seen.get(t.schedule.pk, 0) + 1
        if seen[t.schedule.pk] <= UPCOMING_PER_SCHEDULE:
            kept.append(t)
    return kept


def _overview_stats() -> dict:
    """The fleet's totals, plus QoS policy violations and stale agents for the attention list."""
    stats = selectors.fleet_overview(failed_also=failed_nodes_q(), stuck_also=stuck_nodes_q())
    # One more query for all five (the overview is polled): report totals ride along as scalar subqueries.
    reports = QoSComplianceReport.objects.order_by().annotate(one=Value(1)).values("one")
    agent = Q(cluster__driver=ClusterDriver.AGENT)
    extra = Node.objects.live().aggregate(
        agent_nodes=Count("pk", filter=agent),
        stale_agents=Count("pk", filter=agent & stale_q(stats["now"])),
        policy_violations=Max(Subquery(reports.annotate(n=Sum("violation_count")).values("n"))),
        pools_violating=Max(Subquery(reports.annotate(n=Count("pk", filter=Q(violation_count__gt=0))).values("n"))),
        next_retry_at=Max(Subquery(next_retry_at_subquery())),
    )
    stats.update(extra, agent_stale_seconds=3 * agent_credentials.agent_interval_seconds())
    stats["policy_violations"] = extra["policy_violations"] or 0
    stats["needs_attention"] += stats["policy_violations"]
    embedded = children_status()
    if embedded is not None:  # under `make run`: its parts and how often its supervisor restarted them
        children = embedded["children"]
        stats["embedded"] = {
            "children": children,
            "restarts": sum(c["restarts"] for c in children.values()),
            "down": sum(1 for c in children.values() if c["state"] != "running"),
        }
    return stats


@role_required(Role.VIEWER)
@require_GET
@vary_on_headers("HX-Request")
def overview(request):
    """The fleet at a glance: totals, what needs attention, and the node table (filtered in place over HTMX)."""
    context = node_table(request)
    if not wants_fragment(request):
        context["stats"] = _overview_stats()
        context["upcoming"] = _first_of_each(upcoming_transitions(hours=UPCOMING_HOURS))
        context["upcoming_hours"] = UPCOMING_HOURS
        context["upcoming_per_schedule"] = UPCOMING_PER_SCHEDULE
        context["first_look"] = first_look() if context["stats"].get("embedded") else None
    return render_table_page(request, "console/overview.html", "node-table", context)


@role_required(Role.VIEWER)
@require_GET
def overview_stats(request):
    """The overview's totals, charts and attention list on their own, polled by the overview to stay live."""
    return render(request, "console/overview.html#overview-stats", {"stats": _overview_stats()})
