"""A pool's page (how it selects nodes, what it runs now and why, its schedule and rollouts) and its editor: name,
cluster, selector or members (the members a selector matches shown as you type), default profile, QoS policy and
schedule. Composes fleet, sharing, scheduling and worker; the writes are scheduling.pools'."""

from datetime import timedelta

from django.contrib import messages
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.forms import PoolForm
from console.views.kueue import kueue_card
from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from core.roles import Role
from core.views import confirm_delete, form_add_service_errors, redirect_after_change, role_required
from fleet import selectors
from fleet.models import Cluster, Gpu, Node, NodePool
from fleet.services import pool_overlaps
from scheduling.assign import schedule_rule
from scheduling.models import Schedule
from scheduling.pools import pool_remove, pool_save
from scheduling.selectors import pool_states, schedule_transitions
from sharing.models import NodePin, PoolSharing, QoSComplianceReport
from worker.choices import RolloutStatus
from worker.models import Rollout
from worker.selectors import rollout_progress

POOL_EVENTS = 10
PINS_SHOWN = 20


def _rollouts_in_progress(pool: NodePool) -> list[Rollout]:
    rollouts = list(
        Rollout.objects.filter(pool=pool, status__in=[RolloutStatus.RUNNING, RolloutStatus.PAUSED])
        .select_related("profile")
        .order_by("-created_at")
    )
    for rollout in rollouts:
        rollout.progress = rollout_progress(rollout)
    return rollouts


def _next_transition(schedule: Schedule | None, now):
    if schedule is None or not schedule.enabled:
        return None
    return next(iter(schedule_transitions(schedule, now, now + timedelta(days=8))), None)


@role_required(Role.VIEWER)
@require_GET
def pool_detail(request, pk):
    """One pool: how it selects nodes, its default profile and QoS policy, its schedule, what runs now and why
    (pins, the schedule's window or baseline, the default), rollouts in progress, its Kueue quota, and its nodes and
    GPUs."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    now = timezone.now()
    schedule = Schedule.objects.filter(pool=pool).first()
    pins = NodePin.objects.in_force(now).filter(node__pool=pool, node__gone_at__isnull=True)
    context = {
        "pool": pool,
        "state": pool_states([pool.pk], at=now)[pool.pk],
        "rule": schedule_rule(pool, at=now),
        "defaults": PoolSharing.objects.filter(pool=pool).select_related("profile", "qos_policy").first(),
        "schedule": schedule,
        "next_transition": _next_transition(schedule, now),
        "pin_count": pins.count(),
        "pins": pins.select_related("node", "profile").order_by("node__name")[:PINS_SHOWN],
        "rollouts": _rollouts_in_progress(pool),
        "events": AuditEvent.objects.filter(object_type="nodepool", object_id=str(pool.pk))[:POOL_EVENTS],
        "qos_report": QoSComplianceReport.objects.filter(pool=pool).first(),
        "filter_query": f"pool={pool.pk}",
        "node_summary": selectors.node_state_summary(Node.objects.in_pool(pool)),
        "gpu_summary": selectors.gpu_summary(Gpu.objects.in_pool(pool)),
        "kueue": kueue_card(pool),
    }
    return render(request, "console/pool_detail.html", context)


def _members_preview(form: PoolForm, pool: NodePool | None) -> dict:
    """What the selector as typed would select, and the pools it would share nodes with (the check the save runs)."""
    data = form.cleaned_data if hasattr(form, "cleaned_data") else {}
    cluster = pool.cluster if pool is not None else data.get("cluster")
    selector = (form.data.get("node_selector") or "").strip()
    if cluster is None or not selector:
        return {"cluster": cluster, "selector": selector}
    match = selectors.selector_members(cluster, selector)
    overlaps = [] if match.error else pool_overlaps(cluster=cluster, node_selector=selector, exclude=pool)
    return {"cluster": cluster, "selector": selector, "match": match, "overlaps": overlaps}


def _editor(request, form: PoolForm, pool: NodePool | None, *, error="", status=200, live=False):
    if form.is_bound:
        form.is_valid()
    if form.is_bound:
        preview = _members_preview(form, pool)
    elif pool is not None:
        match = selectors.selector_members(pool.cluster, pool.node_selector) if pool.node_selector else None
        preview = {"cluster": pool.cluster, "selector": pool.node_selector, "match": match, "overlaps": []}
    else:
        preview = {"cluster": form.initial.get("cluster")}
    context = {"form": form, "pool": pool, "preview": preview, "error": error}
    template = "console/pool_form.html"
    return render(request, f"{template}#pool-members" if live else template, context, status=status)


def _save(request, pool: NodePool | None):
    form = PoolForm(request.POST, pool=pool)
    if not form.is_valid() or request.POST.get("action") == "check":
        error = "" if form.is_valid() else "The pool was not saved; see the messages below."
        return _editor(request, form, pool, error=error, status=200 if form.is_valid() else 400)
    try:
        saved = pool_save(
            actor=Actor.for_user(request.user),
            settings=form.settings(),
            pool=pool,
            cluster=None if pool else form.cleaned_data["cluster"],
        )
    except ApplicationError as exc:
        form_add_service_errors(form, exc, fields={"nodes": "members", "windows": "schedule"}, default="name")
        return _editor(request, form, pool, error=exc.message, status=exc.status)
    messages.success(request, f"Pool {saved.name} saved.")
    return redirect_after_change(request, saved.get_absolute_url())


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def pool_create(request):
    """The editor for a new pool (admins); `?cluster=` preselects its cluster."""
    if request.method == "POST":
        return _save(request, None)
    cluster = Cluster.objects.filter(pk=request.GET.get("cluster") or 0).first()
    return _editor(request, PoolForm(initial={"cluster": cluster, "schedule": "keep"}), None)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def pool_update(request, pk):
    """The editor for a pool (admins); its cluster is fixed."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster", "sharing"), pk=pk)
    if request.method == "POST":
        return _save(request, pool)
    return _editor(request, PoolForm(pool=pool), pool)


@role_required(Role.ADMIN)
@require_POST
def pool_members(request):
    """The editor's live preview (HTMX): the nodes the selector as typed selects, and the pools it would overlap."""
    pool = NodePool.objects.select_related("cluster").filter(pk=request.GET.get("pool") or 0).first()
    return _editor(request, PoolForm(request.POST, pool=pool), pool, live=True)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def pool_delete(request, pk):
    """Ask, then delete: its nodes belong to no pool after, its schedule and defaults go with it."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    return confirm_delete(
        request,
        pool,
        key="pool",
        kind="pool",
        label="Pool",
        delete=lambda actor: pool_remove(actor=actor, pool=pool),
        done_url=reverse("fleet:pool_list"),
        template="console/pool_confirm_delete.html",
        counts={
            "member_count": pool.nodes.live().count(),
            "schedule": Schedule.objects.filter(pool=pool).first(),
        },
    )
