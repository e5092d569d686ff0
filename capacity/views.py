"""The capacity pages: a pool's week of demand against capacity with the layout that would have served it best (and
its draft as a profile or a schedule window, both through their usual preview), and GPU-hours per team."""

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from capacity import charts, selectors
from capacity.api.views import gpu_hours_csv
from capacity.forms import DraftForm, GpuHoursForm, WindowForm
from capacity.sampling import sample_seconds
from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role
from core.views import role_required
from fleet.choices import SharingMode
from fleet.models import Node, NodePool
from scheduling.models import Schedule
from sharing import services as sharing_services
from sharing.mig import format_layout, parse_layout
from sharing.models import SharingProfile


def _pool_zone(pool: NodePool) -> str:
    schedule = Schedule.objects.filter(pool=pool).only("time_zone").first()
    return schedule.time_zone if schedule else "UTC"


@role_required(Role.VIEWER)
@require_GET
def pool_capacity(request, pk):
    """A pool's last 7 days: demand (held + waiting) against capacity per resource, and for a window of the week the
    layout that would have served it best, replayed greedily (capacity.whatif)."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    form = WindowForm(request.GET or None, time_zone=_pool_zone(pool))
    window = form.window()
    end = timezone.now()
    week = selectors.week_demand(pool, end)
    recommendation = selectors.recommendation(pool, window, week)
    best = recommendation.best
    draft = None
    if best is not None:
        draft = {
            "layout": format_layout(best.candidate.layout) if best.candidate.layout else "",
            "nodes": best.candidate.nodes,
            "weekdays": window.weekdays,
            "start": window.start.strftime("%H:%M"),
            "end": window.end.strftime("%H:%M"),
            "time_zone": window.tz,
        }
    context = {
        "pool": pool,
        "form": form,
        "window": window,
        "charts": charts.week_charts(week, end - selectors.WEEK, selectors.week_utilisation(pool, end)),
        "recommendation": recommendation,
        "alternatives": sorted(
            recommendation.outcomes, key=lambda o: (-o.started_within_5min, o.idle_pct, o.candidate.nodes)
        )[:5],
        "draft": draft,
        "sample_minutes": sample_seconds() // 60,
    }
    return render(request, "capacity/pool_capacity.html", context)


def _draft_name(pool: NodePool, layout: str) -> str:
    base = slugify(f"{pool.name} {layout or 'whole'}".replace("×", "x").replace(".", "-"))[:80] or "draft"
    name, n = base, 1
    while SharingProfile.objects.filter(name=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


@role_required(Role.ADMIN)
@require_POST
def pool_capacity_draft(request, pk):
    """Turn a recommendation into a profile (created, not assigned: a draft) and send the admin to its preview on
    the recommended nodes, or to the schedule editor with the window prefilled."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    form = DraftForm(request.POST)
    back = reverse("capacity:pool_capacity", args=[pool.pk])
    if not form.is_valid():
        messages.error(request, "The recommendation could not be drafted: " + "; ".join(
            f"{field}: {' '.join(errors)}" for field, errors in form.errors.items()
        ))  # fmt: skip
        return redirect(back)
    data = form.cleaned_data
    nodes, _, products = selectors.pool_shape(pool)
    try:
        layout = parse_layout(data["layout"])
        profile = sharing_services.profile_create(
            actor=Actor.for_user(request.user),
            name=_draft_name(pool, data["layout"]),
            description=f"Drafted from the capacity recommendation for pool {pool} ({data['nodes']} of {nodes} nodes).",
            mode=SharingMode.MIG if layout else SharingMode.PASSTHROUGH,
            target_products=products,
            mig_layouts={"all": layout} if layout else {},
        )
    except (ApplicationError, ValueError) as exc:
        messages.error(request, f"The recommendation could not be drafted: {getattr(exc, 'message', exc)}")
        return redirect(back)
    messages.success(request, f"Profile {profile.name} drafted; nothing changes until it is assigned.")
    if data["kind"] == "profile":
        if data["nodes"] >= nodes:
            query = urlencode({"pool": pool.pk})
        else:
            chosen = Node.objects.live().in_pool(pool).order_by("name").values_list("pk", flat=True)[: data["nodes"]]
            query = urlencode({"nodes": ",".join(str(pk) for pk in chosen)})
        return redirect(f"{reverse('console:profile_preview', args=[profile.pk])}?{query}")
    schedule = Schedule.objects.filter(pool=pool).first()
    window = {
        "window_name": "capacity",
        "window_weekdays": data["weekdays"],
        "window_start": data["start"].strftime("%H:%M"),
        "window_end": data["end"].strftime("%H:%M"),
        "window_profile": profile.pk,
    }
    if schedule is not None:
        return redirect(f"{reverse('scheduling:schedule_update', args=[schedule.pk])}?{urlencode(window, doseq=True)}")
    new = {"pool": pool.pk, "name": f"{pool.name}-capacity", "time_zone": data["time_zone"], **window}
    return redirect(f"{reverse('scheduling:schedule_create')}?{urlencode(new, doseq=True)}")


@role_required(Role.VIEWER)
@require_GET
def gpu_hours(request):
    """GPU-hours per day stacked by namespace or team, the table, a CSV download and how the sum reconciles."""
    form = GpuHoursForm(request.GET or None)
    values = form.values()
    span = {"start": values["start"], "end": values["end"], "pool": values["pool"]}
    rows = selectors.gpu_hours(group_by=values["group_by"], **span)
    if request.GET.get("download") == "csv":
        response = HttpResponse(gpu_hours_csv(rows), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="gpu-hours-{values["start"]}-{values["end"]}.csv"'
        return response
    pool = {"pool": values["pool"].pk} if values["pool"] is not None else {}
    query = {"from": values["start"], "to": values["end"], "group_by": values["group_by"], **pool}
    page = {"start": values["start"], "end": values["end"], "group_by": values["group_by"], **pool}
    totals: dict[str, float] = {}
    for row in rows:
        totals[row["group"]] = totals.get(row["group"], 0.0) + row["gpu_hours"]
    context = {
        "form": form,
        "values": values,
        "rows": rows,
        "totals": sorted(totals.items(), key=lambda kv: -kv[1]),
        "chart": charts.stacked_days(rows, values["start"], values["end"]),
        "reconciliation": selectors.reconciliation(rows, **span),
        "api_query": urlencode(query),
        "page_query": urlencode(page),
        "days": (values["end"] - values["start"] + timedelta(days=1)).days,
    }
    return render(request, "capacity/gpu_hours.html", context)
