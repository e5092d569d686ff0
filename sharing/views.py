"""Sharing pages: profiles (list, page, editor with live validation, delete), the impact preview, assign and pin;
QoS policies (editor with live checks against a pool, attach and detach) and QoS compliance per pool."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Prefetch, Sum
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from core.roles import Role, has_role
from core.views import form_add_service_errors, redirect_after_change, role_required, wants_fragment
from fleet.models import Node, NodePool
from fleet.selectors import planned_mig_layout
from scheduling.models import Schedule, ScheduleWindow
from scheduling.selectors import pool_states, qos_policy_impact
from scheduling.views import days_text
from sharing import selectors, services
from sharing.forms import (
    AssignForm,
    NodePinForm,
    PinForm,
    PreviewScopeForm,
    ProfileForm,
    QoSAttachForm,
    QoSCheckPoolForm,
    QoSPolicyForm,
    layout_text,
)
from sharing.mig import PRODUCTS, mig_resources, validate_layout
from sharing.models import NodePin, PoolSharing, QoSComplianceReport, QoSPolicy, SharingProfile
from sharing.spec import ALL_GPUS, ProfileSpec, validate_spec
from worker.admission import policy_admission_views, pool_admission_views
from worker.rollouts import pool_assign_and_roll_out
from worker.tasks import qos_compliance_check

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


# --- QoS policies ----------------------------------------------------------------------------------------------------

RULE_LABELS = {
    "qos": "Pod QoS class",
    "priority": "Priority class",
    "exclusive": "Exclusive taint",
    "max_pods_per_gpu": "Pods per GPU",
}
IMPACT_EXAMPLES = 5
VIOLATIONS_SHOWN = 500


def _impact(policy: QoSPolicy, pool: NodePool | None) -> dict | None:
    """The policy's impact on a pool, with violations counted per rule and a few examples for the page."""
    impact = qos_policy_impact(policy, pool)
    if impact is not None:
        impact["by_rule"] = _count_by_rule(impact["violations"])
        impact["examples"] = impact["violations"][:IMPACT_EXAMPLES]
    return impact


def _count_by_rule(violations) -> list[dict]:
    counts: dict[str, int] = {}
    for v in violations:
        rule = v["rule"] if isinstance(v, dict) else v.rule
        counts[rule] = counts.get(rule, 0) + 1
    return [{"rule": r, "label": RULE_LABELS.get(r, r), "count": n} for r, n in sorted(counts.items())]


def qos_setting_rows(policy: QoSPolicy) -> list[dict]:
    """The policy's settings per editor section, each with its label and value in its unit ('' when not set)."""
    fields = QoSPolicyForm.base_fields
    return [
        {
            "title": title,
            "help": help_text,
            "rows": [
                {"name": n, "label": fields[n].label, "value": QoSPolicyForm.setting_display(policy, n)} for n in names
            ],
        }
        for title, help_text, names in QoSPolicyForm.SECTIONS
    ]


def qos_rule_summary(policy: QoSPolicy) -> list[str]:
    """The workload rules in a few words, for tables."""
    parts = []
    if policy.required_qos != "any":
        parts.append(policy.get_required_qos_display())
    if policy.required_priority_class:
        parts.append(f"priority {policy.required_priority_class}")
    if policy.max_pods_per_gpu:
        parts.append(f"≤ {policy.max_pods_per_gpu} pods/GPU")
    if policy.exclusive_taint:
        parts.append(f"taint {policy.exclusive_taint}")
    if policy.requires_memory_isolation:
        parts.append("memory isolation")
    return parts


def _check_pool_initial(policy: QoSPolicy | None) -> NodePool | None:
    if policy is None:
        return None
    use = PoolSharing.objects.filter(qos_policy=policy).select_related("pool__cluster").order_by("pool__name").first()
    return use.pool if use else None


def _qos_editor(request, form, policy, *, candidate=None, error="", status=200, live=False):
    pool_form = QoSCheckPoolForm(request.POST if request.method == "POST" else None)
    if pool_form.is_bound:
        pool = pool_form.cleaned_data.get("check_pool") if pool_form.is_valid() else None
    else:
        pool = _check_pool_initial(policy)
        pool_form = QoSCheckPoolForm(initial={"check_pool": pool})
    if candidate is None:
        candidate = form.policy(policy) if form.is_bound else (policy or QoSPolicy())
    context = {
        "form": form,
        "policy": policy,
        "pool_form": pool_form,
        "impact": _impact(candidate, pool),
        "slots": form.field_errors(live=live) if form.is_bound else {},
        "error": error,
    }
    template = "sharing/qos_form.html"
    return render(request, f"{template}#qos-feedback" if live else template, context, status=status)


def _qos_save(request, form: QoSPolicyForm, policy: QoSPolicy | None):
    """Call the create or update service; "Check" (the button without JavaScript) only shows the checks."""
    valid = form.is_valid()
    candidate = form.policy(policy)
    if not valid or request.POST.get("action") == "check":
        form.add_service_errors(services.qos_policy_check(candidate))
        error = "" if valid else "The policy was not saved; see the messages below."
        return _qos_editor(request, form, policy, candidate=candidate, error=error, status=200 if valid else 400)
    actor = Actor.for_user(request.user)
    try:
        if policy is None:
            saved = services.qos_policy_create(actor=actor, **form.values())
        else:
            saved = services.qos_policy_update(actor=actor, policy=policy, **form.values())
    except ApplicationError as exc:
        form.add_service_errors(exc.errors)
        return _qos_editor(request, form, policy, candidate=candidate, error=exc.message, status=exc.status)
    messages.success(request, f"QoS policy {saved.name} saved.")
    return redirect_after_change(request, saved.get_absolute_url())


@login_required
@require_GET
def qos_list(request):
    """Every QoS policy: its workload rules and settings in short, the pools and windows using it, violations."""
    policies = list(
        QoSPolicy.objects.annotate(window_count=Count("schedule_windows")).prefetch_related(
            Prefetch("pools", queryset=PoolSharing.objects.select_related("pool__cluster").order_by("pool__name"))
        )
    )
    violations = dict(
        QoSComplianceReport.objects.filter(policy__isnull=False)
        .values_list("policy_id")
        .annotate(n=Sum("violation_count"))
    )
    for policy in policies:
        policy.rules = qos_rule_summary(policy)
        policy.settings = policy.node_settings()
        policy.violations = violations.get(policy.pk)
    return render(request, "sharing/qos_list.html", {"policies": policies})


def _qos_detail(request, policy: QoSPolicy, *, attach_form=None, attach_error="", status=200):
    pool = None
    if attach_form is not None:
        pool = attach_form.cleaned_data.get("pool") if attach_form.is_valid() else None
    elif request.GET.get("pool") and has_role(request.user, Role.OPERATOR):
        attach_form = QoSAttachForm(request.GET)
        pool = attach_form.cleaned_data["pool"] if attach_form.is_valid() else None
    uses = list(PoolSharing.objects.filter(qos_policy=policy).select_related("pool__cluster").order_by("pool__name"))
    reports = {r.pool_id: r for r in QoSComplianceReport.objects.filter(pool_id__in=[u.pool_id for u in uses])}
    for use in uses:
        use.report = reports.get(use.pool_id)
    windows = list(
        ScheduleWindow.objects.filter(qos_policy=policy)
        .select_related("schedule__pool__cluster", "profile")
        .order_by("schedule__name", "start")
    )
    for window in windows:
        window.days_text = days_text(window.weekdays)
    context = {
        "policy": policy,
        "sections": qos_setting_rows(policy),
        "settings": policy.node_settings(),
        "uses": uses,
        "windows": windows,
        "baselines": Schedule.objects.filter(baseline_qos_policy=policy).select_related("pool__cluster"),
        "events": AuditEvent.objects.filter(object_type="qospolicy", object_id=str(policy.pk))[:10],
        "attach_form": attach_form or QoSAttachForm(),
        "attach_error": attach_error,
        "impact": _impact(policy, pool),
    }
    template = "sharing/qos_detail.html"
    if wants_fragment(request) and "pool" in request.GET and has_role(request.user, Role.OPERATOR):
        template += "#qos-attach"
    else:
        context["admission"] = policy_admission_views(policy)
    return render(request, template, context, status=status)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def qos_detail(request, pk):
    """One policy: every setting, the pools and schedule windows using it, and attaching it to a pool (operators)
    after seeing what it would flag there; `?pool=` shows that impact (HTMX swaps only the attach card)."""
    policy = get_object_or_404(QoSPolicy, pk=pk)
    return _qos_detail(request, policy)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def qos_create(request):
    """The editor for a new QoS policy (admins)."""
    if request.method == "POST":
        return _qos_save(request, QoSPolicyForm(request.POST), None)
    return _qos_editor(request, QoSPolicyForm(), None)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def qos_update(request, pk):
    """The editor for an existing policy (admins); refused when it would contradict a profile it runs with."""
    policy = get_object_or_404(QoSPolicy, pk=pk)
    if request.method == "POST":
        return _qos_save(request, QoSPolicyForm(request.POST, policy=policy), policy)
    return _qos_editor(request, QoSPolicyForm(policy=policy), policy)


@role_required(Role.ADMIN)
@require_POST
def qos_validate(request):
    """Live check for the editor: each field's messages (out of band) and the impact on the chosen pool."""
    policy = None
    if request.GET.get("policy", "").isdigit():
        policy = QoSPolicy.objects.filter(pk=request.GET["policy"]).first()
    form = QoSPolicyForm(request.POST)
    form.is_valid()
    candidate = form.policy(policy)
    form.add_service_errors(services.qos_policy_check(candidate))
    return _qos_editor(request, form, policy, candidate=candidate, live=True)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def qos_delete(request, pk):
    """Ask, then delete; refused (409) while a pool or schedule uses the policy."""
    policy = get_object_or_404(QoSPolicy, pk=pk)
    error, status = "", 200
    if request.method == "POST":
        try:
            services.qos_policy_delete(actor=Actor.for_user(request.user), policy=policy)
        except ApplicationError as exc:
            error, status = exc.message, exc.status
        else:
            messages.success(request, f"QoS policy {policy.name} deleted.")
            return redirect_after_change(request, reverse("sharing:qos_list"))
    context = {
        "policy": policy,
        "error": error,
        "pool_count": policy.pools.count(),
        "window_count": policy.schedule_windows.count(),
    }
    return render(request, "sharing/qos_confirm_delete.html", context, status=status)


@role_required(Role.OPERATOR)
@require_POST
def qos_attach(request, pk):
    """Make the policy a pool's default QoS policy; refused (with the reason) when it contradicts a profile there."""
    policy = get_object_or_404(QoSPolicy, pk=pk)
    form = QoSAttachForm(request.POST)
    if not form.is_valid():
        return _qos_detail(request, policy, attach_form=form, status=400)
    pool = form.cleaned_data["pool"]
    try:
        services.pool_set_qos_policy(actor=Actor.for_user(request.user), pool=pool, policy=policy)
    except ApplicationError as exc:
        form_add_service_errors(form, exc, fields={"qos_policy": "__all__", "profile": "__all__"})
        return _qos_detail(request, policy, attach_form=form, attach_error=exc.message, status=exc.status)
    messages.success(request, f"{policy.name} is now the QoS policy of pool {pool.name}.")
    return redirect_after_change(request, policy.get_absolute_url())


@role_required(Role.OPERATOR)
@require_POST
def qos_detach(request, pk):
    """Take the policy off a pool (only when it is that pool's default)."""
    policy = get_object_or_404(QoSPolicy, pk=pk)
    form = QoSAttachForm(request.POST)
    if form.is_valid():
        pool = form.cleaned_data["pool"]
        if PoolSharing.objects.filter(pool=pool, qos_policy=policy).exists():
            services.pool_set_qos_policy(actor=Actor.for_user(request.user), pool=pool, policy=None)
            messages.success(request, f"{policy.name} taken off pool {pool.name}; the pool has no QoS policy now.")
        else:
            messages.error(request, f"Pool {pool.name} does not use {policy.name}.")
    else:
        messages.error(request, "Choose the pool to take the policy off.")
    return redirect_after_change(request, policy.get_absolute_url())


# --- compliance ------------------------------------------------------------------------------------------------------


def _offenders_by_node(violations: list[dict], node_ids: dict[str, int]) -> list[dict]:
    """Violations as nodes → pods → the rules each breaks (nodes and pods sorted by name)."""
    nodes: dict[str, dict] = {}
    for v in violations:
        node = nodes.setdefault(v["node"], {"name": v["node"], "pk": node_ids.get(v["node"]), "pods": {}})
        pod = node["pods"].setdefault((v["namespace"], v["name"]), {"namespace": v["namespace"], "name": v["name"]})
        pod.setdefault("rules", []).append(
            {"rule": v["rule"], "label": RULE_LABELS.get(v["rule"], v["rule"]), "message": v["message"]}
        )
    return [
        {**node, "pods": [node["pods"][key] for key in sorted(node["pods"])]}
        for node in sorted(nodes.values(), key=lambda n: n["name"])
    ]


@login_required
@require_GET
def compliance_list(request):
    """Every pool's last QoS compliance check: the policy in force now, when it was checked, what it found."""
    pools = list(NodePool.objects.select_related("cluster", "qos_compliance__policy").order_by("cluster__name", "name"))
    states = pool_states([p.pk for p in pools])
    unchecked = selectors.pools_without_pods_to_check(pools)
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
    return render(request, "sharing/compliance_list.html", context)


def _compliance_context(pool: NodePool) -> dict:
    state = pool_states([pool.pk])[pool.pk]
    report = QoSComplianceReport.objects.filter(pool=pool).select_related("policy").first()
    admission = pool_admission_views([pool])
    context = {"pool": pool, "state": state, "report": report, "admission": admission[0] if admission else None}
    context["no_pods_here"] = bool(selectors.pools_without_pods_to_check([pool]))
    if state.qos_policy is not None:
        context["rules"] = qos_rule_summary(state.qos_policy)
    if report is not None:
        violations = report.violations[:VIOLATIONS_SHOWN]
        names = {v["node"] for v in violations} | {m["node"] for m in report.kubelet_mismatches}
        node_ids = dict(Node.objects.filter(cluster_id=pool.cluster_id, name__in=names).values_list("name", "pk"))
        context.update(
            offenders=_offenders_by_node(violations, node_ids),
            mismatches=[{**m, "pk": node_ids.get(m["node"])} for m in report.kubelet_mismatches],
            by_rule=_count_by_rule(report.violations),
            pods_violating=len({(v["namespace"], v["name"]) for v in report.violations}),
            truncated=len(report.violations) > VIOLATIONS_SHOWN,
            stale_policy=report.policy_id != getattr(state.qos_policy, "pk", None),
        )
    return context


@login_required
@require_GET
def pool_compliance(request, pk):
    """One pool against its QoS policy: offending pods grouped by node with the rule each breaks, and kubelets that
    run other policies than it expects."""
    pool = get_object_or_404(NodePool.objects.select_related("cluster"), pk=pk)
    return render(request, "sharing/pool_compliance.html", _compliance_context(pool))


@role_required(Role.OPERATOR)
@require_POST
def pool_compliance_check(request, pk):
    """Check the pool now (the periodic check runs every few minutes) and show the result."""
    pool = get_object_or_404(NodePool, pk=pk)
    found = qos_compliance_check(pool.pk)
    messages.success(request, f"Pool {pool.name} checked: {found} violation{'s' if found != 1 else ''}.")
    return redirect_after_change(request, reverse("sharing:pool_compliance", args=[pool.pk]))
