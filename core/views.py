"""Health, readiness and metrics endpoints, the user's API token page, the audit log, and helpers of UI views."""

import hmac
import json
from functools import wraps

from django.apps import apps
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.urls import reverse
from django.utils.text import capfirst
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseLocation
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core import health, services
from core.audit import Actor
from core.authentication import ApiTokenAuthentication
from core.exceptions import ApplicationError
from core.filtersets import AuditEventFilterSet
from core.metrics import REGISTRY
from core.models import ApiToken, AuditEvent
from core.roles import Role, has_role, user_role


def page_not_found(request, exception):
    """No route: JSON in the one error shape under /api/ (what the schema documents for a 404), else the page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"message": "Not found.", "errors": {}}, status=404)
    return defaults.page_not_found(request, exception)


@require_GET
def healthz(request):
    """Liveness: the process answers."""
    return JsonResponse({"status": "ok"})


@require_GET
def favicon(request):
    """Browsers ask for /favicon.ico on pages that link no icon (Django's admin, Swagger UI's split view): the
    logo, not a 404."""
    return redirect(static("icons/tessera.svg"), permanent=True)


@require_GET
@vary_on_headers("Authorization")
def readyz(request):
    """Readiness, per dependency (core.health): 503 when a required one fails. The checks in words (cluster names,
    the database engine, the broker) only to those who may read /metrics; anyone else gets the status alone."""
    checks = health.run_checks()
    failed_required = [c.name for c in checks if not c.ok and health.required(c)]
    status = "unavailable" if failed_required else ("ok" if all(c.ok for c in checks) else "degraded")
    body: dict = {"status": status}
    if _may_read_operations(request):
        body["checks"] = {c.name: {"ok": c.ok, "required": health.required(c), "detail": c.detail} for c in checks}
    return JsonResponse(body, status=503 if failed_required else 200, json_dumps_params={"indent": 2})


def _may_read_operations(request) -> bool:
    """Who may read /metrics and /readyz's details: the bearer token of TESSERA["METRICS_TOKEN"] (Prometheus, a
    probe that wants the details), a viewer signed in or with their API token, or anyone when
    TESSERA["METRICS_PUBLIC"] says so."""
    expected = settings.TESSERA["METRICS_TOKEN"]
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if expected and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode()):
        return True
    return settings.TESSERA["METRICS_PUBLIC"] or has_role(_caller(request), Role.VIEWER)


def _caller(request):
    """The user of an API token (`Authorization: Token …`: a token acts with its user's role) or of the session;
    anonymous when the token does not hold."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != ApiTokenAuthentication.keyword:
        return request.user
    token = services.api_token_authenticate(given.strip()) if given.strip().isascii() else None
    return token.user if token is not None and token.user.is_active else AnonymousUser()


@require_GET
@vary_on_headers("Authorization")
def metrics(request):
    """Prometheus exposition of fleet gauges, computed from the database at scrape time."""
    if not _may_read_operations(request):
        status = 403 if _caller(request).is_authenticated else 401
        text = "Metrics need the metrics bearer token, or a viewer's sign-in or API token.\n"
        response = HttpResponse(text, status=status)
        response["WWW-Authenticate"] = 'Bearer realm="tessera-metrics"'
        return response
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


# --- shared by the UI views of every app ---------------------------------------------------------------------------


NO_ROLE = "Your account has no role yet: ask an admin to give you one (viewer, operator or admin)."


def role_required(role: Role):
    """Sign-in first, then 403 for a user below `role`: every UI view goes through this, reads with Role.VIEWER,
    as the API asks a viewer role for every read (tests/core/test_authz_matrix.py tries every route)."""

    def decorator(view):
        @wraps(view)
        @login_required
        def wrapper(request, *args, **kwargs):
            held = user_role(request.user)
            if held == Role.NONE:
                raise PermissionDenied(NO_ROLE)
            if held < role:
                raise PermissionDenied(f"This needs the {role.name.lower()} role.")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def docs_sign_in(view):
    """The HTML API docs send an anonymous visitor to sign in (unless public); the role is the schema view's
    permission (core.permissions.ApiDocsPermission), which also answers API clients with their token."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not settings.TESSERA["API_DOCS_PUBLIC"] and not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapper


@role_required(Role.VIEWER)
@require_http_methods(["GET", "POST"])
@never_cache
def token_detail(request):
    """The user's API token: when it was made and expires; POST makes a new one (the old one stops working at once)
    and shows it this once. Never cached: the answer to the POST holds the token."""
    plain = None
    if request.method == "POST":
        _, plain = services.api_token_rotate(user=request.user)
    token = ApiToken.objects.filter(user=request.user).first()
    return render(request, "core/token_detail.html", {"token": token, "plain": plain})


def redirect_after_change(request, url: str):
    """After a successful change: HX-Location over HTMX (no full reload), a plain 302 otherwise."""
    if request.htmx:
        return HttpResponseLocation(url)
    return redirect(url)


def wants_fragment(request) -> bool:
    """HTMX asks for a fragment, except when restoring a page missing from its history cache."""
    return bool(request.htmx) and not request.htmx.history_restore_request


def paginate(request, rows, per_page: int):
    """The requested page of `rows` (`?page=`), with the elided page range the pagination partial draws."""
    page = Paginator(rows, per_page).get_page(request.GET.get("page"))
    page.elided_range = list(page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1))
    return page


def render_table_page(request, template: str, partial: str, context: dict):
    """The whole page, or only its table partial when HTMX swaps the table in place (filters, paging)."""
    return render(request, f"{template}#{partial}" if wants_fragment(request) else template, context)


def confirm_delete(request, obj, *, key: str, kind: str, label: str, delete, done_url: str, template: str, counts):
    """Ask (GET), then delete with `delete(actor)` (POST); a refusal (in use: 409) shows the page again with its
    reason. `key` names the object in the template's context, `kind` fills its button, `label` its message."""
    error, status = "", 200
    if request.method == "POST":
        try:
            delete(Actor.for_user(request.user))
        except ApplicationError as exc:
            error, status = exc.message, exc.status
        else:
            messages.success(request, f"{label} {obj.name} deleted.")
            return redirect_after_change(request, done_url)
    context = {key: obj, "obj": obj, "kind": kind, "error": error, **counts}
    return render(request, template, context, status=status)


def form_add_service_errors(form, exc, *, default: str, fields: dict[str, str] | None = None) -> None:
    """Show an ApplicationError (or a model ValidationError) in a form: each message beside its field.

    `fields` maps the service's field names to the form's; messages about anything else go beside `default`, the
    field the user acts on, so no message floats without a field.
    """
    errors = getattr(exc, "errors", None) or getattr(exc, "message_dict", None) or {}
    fields = fields or {}
    placed = False
    for key, texts in errors.items():
        name = fields.get(key, key)
        target = name if name in form.fields else default
        for message in texts:
            form.add_error(target, message)
            placed = True
    if not placed:
        form.add_error(default, getattr(exc, "message", None) or "; ".join(getattr(exc, "messages", [str(exc)])))


# --- audit log -----------------------------------------------------------------------------------------------------

AUDIT_PAGE_SIZE = 50
AUDIT_OBJECT_TYPES = (
    "sharingprofile",
    "nodepool",
    "node",
    "schedule",
    "rollout",
    "nodechange",
    "qospolicy",
    "cluster",
    "agentjointoken",
    "kueuebinding",
    "user",
    "config",  # a config apply (manifests): one event listing every change
)
_MISSING = object()
AUDIT_DIFF_ROWS = 6
_OBJECT_URLS = {
    "sharingprofile": "sharing:profile_detail",
    "nodepool": "console:pool_detail",
    "node": "console:node_detail",
    "cluster": "fleet:cluster_detail",
    "schedule": "scheduling:schedule_detail",
    "rollout": "worker:rollout_detail",
}


def object_type_label(model_name: str) -> str:
    """The words for an audited object's type ("Sharing profile", not "sharingprofile"), from its model's verbose
    name; core looks the model up by name in the app registry, so it imports no higher layer."""
    for model in apps.get_models():
        if model._meta.model_name == model_name:
            return capfirst(model._meta.verbose_name)
    return model_name


def _compact(value) -> str:
    text = json.dumps(value, separators=(", ", ": "), ensure_ascii=False, default=str)
    return text if len(text) <= 160 else text[:157] + "…"


def audit_diff(before, after) -> list[dict]:
    """Before → after as rows of what changed: one row per changed key of objects (a created or deleted object
    lists its keys), else the two values whole; at most AUDIT_DIFF_ROWS rows and a last one saying how many more."""
    if isinstance(before, dict) or isinstance(after, dict):
        old = before if isinstance(before, dict) else {}
        new = after if isinstance(after, dict) else {}
        keys = [k for k in {**old, **new} if old.get(k, _MISSING) != new.get(k, _MISSING)]
        rows = [
            {
                "key": k,
                "before": _compact(old[k]) if k in old else None,
                "after": _compact(new[k]) if k in new else None,
            }
            for k in keys[:AUDIT_DIFF_ROWS]
        ]
        if len(keys) > AUDIT_DIFF_ROWS:
            rows.append({"key": "", "before": None, "after": None, "more": len(keys) - AUDIT_DIFF_ROWS})
        return rows
    if before is None and after is None:
        return []
    return [
        {
            "key": "",
            "before": None if before is None else _compact(before),
            "after": None if after is None else _compact(after),
        }
    ]


@role_required(Role.VIEWER)
@require_GET
@vary_on_headers("HX-Request")
def audit_log(request):
    """Every change of desired state and every rollout transition, filterable; HTMX swaps only the table."""
    filterset = AuditEventFilterSet(request.GET, queryset=AuditEvent.objects.all())
    page = paginate(request, filterset.qs, AUDIT_PAGE_SIZE)
    prefixes = {}  # each object page's URL reversed once per page, not once a row
    for event in page.object_list:
        event.diff = audit_diff(event.before, event.after)
        name = _OBJECT_URLS.get(event.object_type)
        if name and event.object_id.isdigit():
            if name not in prefixes:
                prefixes[name] = reverse(name, args=[0]).removesuffix("0/")
            event.url = f"{prefixes[name]}{event.object_id}/"
        else:
            event.url = ""
        event.object_type_label = object_type_label(event.object_type)
    context = {
        "filterset": filterset,
        "page_obj": page,
        "table_url": request.path,
        "object_types": sorted(((t, object_type_label(t)) for t in AUDIT_OBJECT_TYPES), key=lambda t: t[1]),
        "actor_kinds": AuditEvent.ActorKind.choices,
        "is_filtered": any(v for k, v in request.GET.items() if k != "page"),
    }
    return render_table_page(request, "core/audit_log.html", "audit-table", context)
