"""QoS policy pages: the list, the editor with live checks and the impact on a pool's pods (scheduling decides
which policy a pool runs now), each policy's page with its admission state (worker), attach and detach."""

from django.contrib import messages
from django.db.models import Count, Prefetch, Sum
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from core.roles import Role, has_role
from core.views import confirm_delete, form_add_service_errors, redirect_after_change, role_required, wants_fragment
from fleet.models import NodePool
from scheduling.models import Schedule, ScheduleWindow
from scheduling.selectors import qos_policy_impact
from scheduling.timeline import days_text
from sharing import display, services
from sharing.forms import QoSAttachForm, QoSCheckPoolForm, QoSPolicyForm
from sharing.models import PoolSharing, QoSComplianceReport, QoSPolicy
from worker.admission import policy_admission_views

IMPACT_EXAMPLES = 5


def _impact(policy: QoSPolicy, pool: NodePool | None) -> dict | None:
    """The policy's impact on a pool, with violations counted per rule and a few examples for the page."""
    impact = qos_policy_impact(policy, pool)
    if impact is not None:
        impact["by_rule"] = display.count_by_rule(impact["violations"])
        impact["examples"] = impact["violations"][:IMPACT_EXAMPLES]
    return impact


def _check_pool_initial(policy: QoSPolicy | None) -> NodePool | None:
    if policy is None:
        return None
    use = PoolSharing.objects.filter(qos_policy=policy).select_related("pool__cluster").order_by("pool__name").first()
    return use.pool if use else None


def _measured_pool(request) -> list[NodePool]:
    """The pool the editor measures the policy against: its GPU settings are checked against that pool's boards
    too (the pools the policy applies to are always checked)."""
    pool_form = QoSCheckPoolForm(request.POST)
    pool = pool_form.cleaned_data.get("check_pool") if pool_form.is_valid() else None
    return [pool] if pool else []


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
    template = "console/qos_form.html"
    return render(request, f"{template}#qos-feedback" if live else template, context, status=status)


def _qos_save(request, form: QoSPolicyForm, policy: QoSPolicy | None):
    """Call the create or update service; "Check" (the button without JavaScript) only shows the checks."""
    valid = form.is_valid()
    candidate = form.policy(policy)
    if not valid or request.POST.get("action") == "check":
        form.add_service_errors(services.qos_policy_check(candidate, pools=_measured_pool(request)))
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


@role_required(Role.VIEWER)
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
        policy.rules = display.qos_rule_summary(policy)
        policy.settings = policy.node_settings()
        policy.violations = violations.get(policy.pk)
    return render(request, "console/qos_list.html", {"policies": policies})


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
        "sections": display.qos_setting_rows(policy),
        "settings": policy.node_settings(),
        "uses": uses,
        "windows": windows,
        "baselines": Schedule.objects.filter(baseline_qos_policy=policy).select_related("pool__cluster"),
        "events": AuditEvent.objects.filter(object_type="qospolicy", object_id=str(policy.pk))[:10],
        "attach_form": attach_form or QoSAttachForm(),
        "attach_error": attach_error,
        "impact": _impact(policy, pool),
    }
    template = "console/qos_detail.html"
    if wants_fragment(request) and "pool" in request.GET and has_role(request.user, Role.OPERATOR):
        template += "#qos-attach"
    else:
        context["admission"] = policy_admission_views(policy)
    return render(request, template, context, status=status)


@role_required(Role.VIEWER)
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
    form.add_service_errors(services.qos_policy_check(candidate, pools=_measured_pool(request)))
    return _qos_editor(request, form, policy, candidate=candidate, live=True)


@role_required(Role.ADMIN)
@require_http_methods(["GET", "POST"])
def qos_delete(request, pk):
    """Ask, then delete; refused (409) while a pool or schedule uses the policy."""
    policy = get_object_or_404(QoSPolicy, pk=pk)
    return confirm_delete(
        request,
        policy,
        key="policy",
        kind="policy",
        label="QoS policy",
        delete=lambda actor: services.qos_policy_delete(actor=actor, policy=policy),
        done_url=reverse("console:qos_list"),
        template="console/qos_confirm_delete.html",
        counts={"pool_count": policy.pools.count(), "window_count": policy.schedule_windows.count()},
    )


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
        form_add_service_errors(form, exc, fields={"qos_policy": "pool", "profile": "pool"}, default="pool")
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
