"""Sharing pages: profiles (list, page, editor with live validation, delete), the impact preview, assign and pin."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from core.roles import Role, has_role
from core.views import form_add_service_errors, redirect_after_change, role_required
from fleet.models import Node, NodePool
from fleet.selectors import planned_mig_layout
from sharing import selectors, services
from sharing.forms import AssignForm, NodePinForm, PinForm, PreviewScopeForm, ProfileForm, layout_text
from sharing.mig import PRODUCTS, mig_resources, validate_layout
from sharing.models import NodePin, PoolSharing, SharingProfile
from sharing.spec import ALL_GPUS, ProfileSpec, validate_spec
from worker.reconcile import pool_assign_and_roll_out

PIN_CANDIDATES = 200


def _layout_keys(mig_layouts) -> list[tuple[str, str]]:
    """(key, where) of a profile's MIG layouts, the every-GPU entry first, then by GPU index."""
    keys = sorted(mig_layouts, key=lambda k: (k != ALL_GPUS, k.zfill(3)))
    return [(k, "every GPU" if k == ALL_GPUS else f"GPU {k}") for k in keys]


def layout_lines(mig_layouts) -> list[tuple[str, str]]:
    """(where, layout) rows of a profile's MIG layouts in the admin notation."""
    return [(where, layout_text(mig_layouts[key])) for key, where in _layout_keys(mig_layouts)]


def layout_drawings(spec: ProfileSpec, *, prefix: str = "plan") -> list[dict]:
    """Per target product and layout entry: NVIDIA's verdict and, when it fits, the slices drawn."""
    if spec.mode != "mig":
        return []
    drawings = []
    for p, name in enumerate(spec.target_products):
        product = PRODUCTS.get(name)
        if product is None:
            continue
        entries = []
        for key, where in _layout_keys(spec.mig_layouts):
            layout = spec.mig_layouts[key]
            entry = {"key": key, "where": where, "off": layout is None, "gpu": {"pk": f"{prefix}-{p}-{key}"}}
            if layout is not None and product.mig_capable:
                result = validate_layout(product, layout)
                entry["result"] = result
                if result.valid:
                    entry["drawing"] = planned_mig_layout(name, result.placements)
                    entry["resources"] = mig_resources(product, layout)
            entries.append(entry)
        drawings.append({"product": product, "entries": entries})
    return drawings


def _editor(request, form, profile, *, spec: ProfileSpec | None = None, error: str = "", status: int = 200):
    if spec is None:
        spec = form.spec() if form.is_bound else (profile.to_spec() if profile else ProfileSpec(mode="mig"))
    context = {
        "form": form,
        "profile": profile,
        "drawings": layout_drawings(spec),
        "slots": form.field_errors() if form.is_bound else {},
        "error": error,
        "mode": spec.mode,
    }
    return render(request, "sharing/profile_form.html", context, status=status)


def _save(request, form: ProfileForm, profile: SharingProfile | None):
    """Call the create or update service; on refusal, the editor again with the messages beside the fields."""
    valid = form.is_valid()
    spec = form.spec()  # before the messages are attached, which drop the fields they are about
    if not valid:
        form.add_service_errors(validate_spec(spec))
        error = "The profile was not saved; see the messages below."
        return _editor(request, form, profile, spec=spec, error=error, status=400)
    actor = Actor.for_user(request.user)
    try:
        if profile is None:
            saved = services.profile_create(actor=actor, **form.values())
        else:
            saved = services.profile_update(actor=actor, profile=profile, **form.values())
    except ApplicationError as exc:
        form.add_service_errors(exc.errors)
        return _editor(request, form, profile, spec=spec, error=exc.message, status=exc.status)
    except ValidationError as exc:  # model rules checked by full_clean inside the service (unique name)
        form.add_service_errors(exc.message_dict)
        return _editor(request, form, profile, spec=spec, error="The profile was not saved.", status=400)
    messages.success(request, f"Profile {saved.name} saved.")
    return redirect_after_change(request, saved.get_absolute_url())


@login_required
@require_GET
def profile_list(request):
    """Every sharing profile: mode, layouts, target products, and the pools and nodes that use it."""
    profiles = list(
        SharingProfile.objects.annotate(pin_count=Count("pins")).prefetch_related(
            Prefetch("pools", queryset=PoolSharing.objects.select_related("pool__cluster").order_by("pool__name"))
        )
    )
    for profile in profiles:
        profile.layout_rows = layout_lines(profile.mig_layouts)
    return render(request, "sharing/profile_list.html", {"profiles": profiles})


@login_required
@require_GET
def profile_detail(request, pk):
    """One profile: its spec, the layout drawn per product, who uses it, assign and pin (through the preview)."""
    profile = get_object_or_404(SharingProfile.objects.select_related("created_by"), pk=pk)
    context = {
        "profile": profile,
        "layout_rows": layout_lines(profile.mig_layouts),
        "drawings": layout_drawings(profile.to_spec()),
        "pools": PoolSharing.objects.filter(profile=profile).select_related("pool__cluster").order_by("pool__name"),
        "pins": NodePin.objects.filter(profile=profile).select_related("node", "pinned_by").order_by("node__name"),
        "events": AuditEvent.objects.filter(object_type="sharingprofile", object_id=str(profile.pk))[:10],
    }
    if has_role(request.user, Role.OPERATOR):
        context["pool_choices"] = NodePool.objects.select_related("cluster", "sharing__profile").order_by(
            "cluster__name", "name"
        )
        context["node_choices"] = (
            Node.objects.live()
            .filter(gpus__product__in=profile.target_products, gpus__gone_at__isnull=True)
            .distinct()
            .select_related("cluster")
            .order_by("cluster__name", "name")[:PIN_CANDIDATES]
        )
    return render(request, "sharing/profile_detail.html", context)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def profile_create(request):
    """The editor for a new profile (admins)."""
    if request.method == "POST":
        return _save(request, ProfileForm(request.POST), None)
    return _editor(request, ProfileForm(), None)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def profile_update(request, pk):
    """The editor for an existing profile (admins); nodes using it follow on the next reconcile."""
    profile = get_object_or_404(SharingProfile, pk=pk)
    if request.method == "POST":
        return _save(request, ProfileForm(request.POST, profile=profile), profile)
    return _editor(request, ProfileForm(profile=profile), profile)


@role_required(Role.ADMIN)
@require_POST
def profile_validate(request):
    """Live validation for the editor: each field's messages (out-of-band) and the layouts drawn per product."""
    form = ProfileForm(request.POST)
    form.is_valid()
    spec = form.spec()
    form.add_service_errors(validate_spec(spec))
    context = {
        "form": form,
        "drawings": layout_drawings(spec),
        "slots": form.field_errors(live=True),
        "mode": spec.mode,
    }
    return render(request, "sharing/profile_form.html#profile-feedback", context)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def profile_delete(request, pk):
    """Ask, then delete; refused (409) while a pool, pin or schedule uses the profile."""
    profile = get_object_or_404(SharingProfile, pk=pk)
    error, status = "", 200
    if request.method == "POST":
        try:
            services.profile_delete(actor=Actor.for_user(request.user), profile=profile)
        except ApplicationError as exc:
            error, status = exc.message, exc.status
        else:
            messages.success(request, f"Profile {profile.name} deleted.")
            return redirect_after_change(request, reverse("sharing:profile_list"))
    context = {
        "profile": profile,
        "error": error,
        "pool_count": profile.pools.count(),
        "pin_count": profile.pins.count(),
    }
    return render(request, "sharing/profile_confirm_delete.html", context, status=status)


# --- preview, assign, pin --------------------------------------------------------------------------------------


def _preview(request, profile, scope: PreviewScopeForm, *, assign_form=None, pin_form=None, status=200):
    context = {"profile": profile, "scope": scope, "pools": NodePool.objects.select_related("cluster")}
    if scope.is_valid():
        impacts = selectors.profile_preview(profile, scope.nodes_queryset())
        for impact in impacts:
            impact.disruption_text = selectors.DISRUPTION_TEXT[impact.disruption]
        pool = scope.cleaned_data.get("pool")
        context.update(ready=True, impacts=impacts, summary=selectors.preview_summary(impacts), pool=pool)
        if pool is not None:
            context["current"] = PoolSharing.objects.filter(pool=pool).select_related("profile").first()
            context["assign_form"] = assign_form or AssignForm(initial={"pool": pool})
        else:
            context["pin_form"] = pin_form or PinForm(initial={"nodes": scope.cleaned_data["nodes"]})
    elif status == 200:
        status = 400 if scope.is_bound and any(request.GET.values()) else 200
    return render(request, "sharing/profile_preview.html", context, status=status)


@login_required
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
    form = AssignForm(request.POST)
    if form.is_valid():
        pool, actor = form.cleaned_data["pool"], Actor.for_user(request.user)
        try:
            strategy = form.strategy() if form.cleaned_data["rollout_now"] else None
            rollout_ids = pool_assign_and_roll_out(actor=actor, pool=pool, profile=profile, strategy=strategy)
        except ApplicationError as exc:
            form_add_service_errors(form, exc, fields={"profile": "__all__", "nodes": "__all__"})
            status = exc.status
        else:
            messages.success(request, f"{profile.name} is now the default profile of pool {pool.name}.")
            if len(rollout_ids) == 1:
                return redirect_after_change(request, reverse("worker:rollout_detail", args=rollout_ids))
            if rollout_ids:
                return redirect_after_change(request, reverse("worker:rollout_list") + "?active=true")
            return redirect_after_change(request, profile.get_absolute_url())
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
            with transaction.atomic():
                for node in nodes:
                    services.node_pin_profile(
                        actor=actor, node=node, profile=profile, reason=form.cleaned_data["reason"]
                    )
        except ApplicationError as exc:
            form_add_service_errors(form, exc, fields={"profile": "__all__"})
            status = exc.status
        else:
            messages.success(request, f"Pinned {len(nodes)} node{'s' if len(nodes) != 1 else ''} to {profile.name}.")
            url = nodes[0].get_absolute_url() if len(nodes) == 1 else profile.get_absolute_url()
            return redirect_after_change(request, url)
    scope = PreviewScopeForm({"nodes": ",".join(request.POST.getlist("nodes"))})
    return _preview(request, profile, scope, pin_form=form, status=status)


@role_required(Role.OPERATOR)
@require_POST
def node_pin(request, pk):
    """From a node page: preview the impact of a pin first (the default button), or pin at once."""
    node = get_object_or_404(Node, pk=pk)
    form = NodePinForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a profile to pin the node to.")
        return redirect_after_change(request, node.get_absolute_url())
    profile = form.cleaned_data["profile"]
    if request.POST.get("action") != "pin":
        return redirect_after_change(
            request, reverse("sharing:profile_preview", args=[profile.pk]) + f"?nodes={node.pk}"
        )
    try:
        services.node_pin_profile(
            actor=Actor.for_user(request.user), node=node, profile=profile, reason=form.cleaned_data["reason"]
        )
    except ApplicationError as exc:
        messages.error(request, "; ".join([exc.message, *exc.errors.get("profile", [])]))
    else:
        messages.success(request, f"{node.name} pinned to {profile.name}.")
    return redirect_after_change(request, node.get_absolute_url())


@role_required(Role.OPERATOR)
@require_POST
def node_unpin(request, pk):
    """Return the node to its pool's (or schedule's) profile."""
    node = get_object_or_404(Node, pk=pk)
    services.node_unpin(actor=Actor.for_user(request.user), node=node)
    messages.success(request, f"{node.name} unpinned; it follows its pool again.")
    return redirect_after_change(request, node.get_absolute_url())
