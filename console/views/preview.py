"""Preview a profile on a pool or on nodes, then confirm: assign it to the pool (optionally rolling out now with a
strategy) or pin the nodes. While the pool's schedule sets its profile, the page says what the schedule will do and
when, and offers the three things the admin may mean (scheduling.assign); for a pool whose Kueue quota Tessera
keeps, the quota before → after. Composes sharing's impact, scheduling's schedule and worker's rollouts."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_POST

from console.forms import ScheduledAssignForm
from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role
from core.views import form_add_service_errors, redirect_after_change, role_required
from fleet.models import NodePool
from scheduling.assign import AssignMode, schedule_rule
from scheduling.kueue import profile_quota
from scheduling.models import KueueBinding
from sharing import selectors as sharing_selectors
from sharing import services
from sharing.forms import PinForm, PreviewScopeForm
from sharing.models import PoolSharing, SharingProfile
from worker.rollouts import pool_assign_and_roll_out


def _preview(request, profile, scope: PreviewScopeForm, *, assign_form=None, pin_form=None, status=200):
    context = {"profile": profile, "scope": scope, "pools": NodePool.objects.select_related("cluster")}
    if scope.is_valid():
        try:
            impacts = sharing_selectors.profile_preview(profile, scope.nodes_queryset())
        except ApplicationError as exc:  # the cluster's MIG strategy cannot run the profile at all
            context.update(refused=exc.message, refusals=exc.errors.get("profile", []))
            return render(request, "console/profile_preview.html", context, status=exc.status)
        for impact in impacts:
            impact.disruption_text = sharing_selectors.DISRUPTION_TEXT[impact.disruption]
        pool = scope.cleaned_data.get("pool")
        context.update(ready=True, impacts=impacts, summary=sharing_selectors.preview_summary(impacts), pool=pool)
        if pool is not None:
            context["current"] = PoolSharing.objects.filter(pool=pool).select_related("profile").first()
            context["rule"] = schedule_rule(pool)
            context["assign_form"] = assign_form or ScheduledAssignForm(initial={"pool": pool})
            binding = KueueBinding.objects.filter(pool=pool, enabled=True, pool__cluster__driver="kubernetes").first()
            if binding is not None:
                context.update(kueue_binding=binding, kueue_quota=profile_quota(pool, profile))
        else:
            context["pin_form"] = pin_form or PinForm(initial={"nodes": scope.cleaned_data["nodes"]})
    elif status == 200:
        status = 400 if scope.is_bound and any(request.GET.values()) else 200
    return render(request, "console/profile_preview.html", context, status=status)


@role_required(Role.VIEWER)
@require_GET
def profile_preview(request, pk):
    """What applying the profile to a pool or to nodes would do, before an operator confirms it."""
    profile = get_object_or_404(SharingProfile, pk=pk)
    return _preview(request, profile, PreviewScopeForm(request.GET))


@role_required(Role.OPERATOR)
@require_POST
def profile_assign(request, pk):
    """Confirmed from a pool preview: the profile becomes the pool's default, optionally rolled out now."""
    profile = get_object_or_404(SharingProfile, pk=pk)
    form = ScheduledAssignForm(request.POST)
    if form.is_valid():
        pool, actor = form.cleaned_data["pool"], Actor.for_user(request.user)
        try:
            strategy = form.strategy() if form.cleaned_data["rollout_now"] else None
            assignment, rollout = pool_assign_and_roll_out(
                actor=actor, pool=pool, profile=profile, strategy=strategy, mode=form.cleaned_data["mode"]
            )
        except ApplicationError as exc:
            form_add_service_errors(
                form,
                exc,
                fields={"profile": "pool", "nodes": "pool", "rollout_now": "rollout_now", "mode": "mode"},
                default="pool",
            )
            status = exc.status
        else:
            messages.success(request, assignment.message)
            if rollout is not None:
                return redirect_after_change(request, rollout.get_absolute_url())
            done = pool.get_absolute_url() if assignment.mode != AssignMode.DEFAULT else profile.get_absolute_url()
            return redirect_after_change(request, done)
    else:
        status = 400
    scope = PreviewScopeForm({"pool": request.POST.get("pool", "")})
    return _preview(request, profile, scope, assign_form=form, status=status)


@role_required(Role.OPERATOR)
@require_POST
def profile_pin(request, pk):
    """Confirmed from a node preview: pin the nodes to the profile, overriding pool and schedule."""
    profile = get_object_or_404(SharingProfile, pk=pk)
    form = PinForm(request.POST)
    status = 400
    if form.is_valid():
        actor, nodes = Actor.for_user(request.user), list(form.cleaned_data["nodes"])
        try:
            services.nodes_pin_profile(actor=actor, nodes=nodes, profile=profile, reason=form.cleaned_data["reason"])
        except ApplicationError as exc:
            form_add_service_errors(form, exc, fields={"profile": "nodes"}, default="nodes")
            status = exc.status
        else:
            messages.success(request, f"Pinned {len(nodes)} node{'s' if len(nodes) != 1 else ''} to {profile.name}.")
            url = nodes[0].get_absolute_url() if len(nodes) == 1 else profile.get_absolute_url()
            return redirect_after_change(request, url)
    scope = PreviewScopeForm({"nodes": ",".join(request.POST.getlist("nodes"))})
    return _preview(request, profile, scope, pin_form=form, status=status)
