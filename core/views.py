"""Health, readiness and Prometheus metrics endpoints, and the user's own API token page."""

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core import services
from core.metrics import REGISTRY


@require_GET
def healthz(request):
    """Liveness: the process answers."""
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request):
    """Readiness: the database answers."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any database failure means not ready
        return JsonResponse({"status": "unavailable", "database": str(exc)}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


@require_GET
def metrics(request):
    """Prometheus exposition of fleet gauges, computed from the database at scrape time."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


@login_required
@require_http_methods(["GET", "POST"])
def token_detail(request):
    """Show the user's API token; POST rotates it (the old one stops working at once)."""
    if request.method == "POST":
        services.api_token_rotate(user=request.user)
        return redirect("token_detail")
    token = services.api_token_get_or_create(user=request.user)
    return render(request, "core/token_detail.html", {"token": token})
