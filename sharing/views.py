"""Profile pages: the list, each profile's page with its layouts drawn per product, the editor with NVIDIA's rules
checked live; and pinning a node from its page. Preview, assign and QoS pages compose other apps: see `console`."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from core.roles import Role, has_role
from core.views import confirm_delete, redirect_after_change, role_required
from fleet.models import Node, NodePool
from sharing import services
from sharing.display import layout_drawings, layout_lines
from sharing.forms import NodePinForm, ProfileForm
from sharing.models import NodePin, PoolSharing, SharingProfile
from sharing.selectors import profile_on_clusters
from sharing.spec import ProfileSpec, validate_spec

PIN_CANDIDATES = 200


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
        "clusters": profile_on_clusters(spec),
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


@role_required(Role.VIEWER)
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


@role_required(Role.VIEWER)
@require_GET
def profile_detail(request, pk):
    """One profile: its spec, the layout drawn per product, who uses it, assign and pin (through the preview)."""
    profile = get_object_or_404(SharingProfile.objects.select_related("created_by"), pk=pk)
    context = {
        "profile": profile,
        "layout_rows": layout_lines(profile.mig_layouts),
        "drawings": layout_drawings(profile.to_spec()),
        "clusters": profile_on_clusters(profile.to_spec()),
        # Only the columns the lists show: a pin's node and a pool carry dozens (bench/b5_pages.py).
        "pools": PoolSharing.objects.filter(profile=profile)
        .select_related("pool__cluster")
        .only("pool", "updated_at", "pool__name", "pool__cluster__name")
        .order_by("pool__name"),
        "pins": NodePin.objects.filter(profile=profile)
        .select_related("node", "pinned_by")
        .only("reason", "node__name", "pinned_by__username")
        .order_by("node__name"),
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
    return confirm_delete(
        request,
        profile,
        key="profile",
        kind="profile",
        label="Profile",
        delete=lambda actor: services.profile_delete(actor=actor, profile=profile),
        done_url=reverse("sharing:profile_list"),
        template="sharing/profile_confirm_delete.html",
        counts={"pool_count": profile.pools.count(), "pin_count": profile.pins.count()},
    )


# --- pins ----------------------------------------------------------------------------------------------------------


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
            request, reverse("console:profile_preview", args=[profile.pk]) + f"?nodes={node.pk}"
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
