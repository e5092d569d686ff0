"""Top-level routes: UI pages per app, the API under /api/v1/, schema and docs (Swagger UI only: Redoc fetches its
vendor's logo from a CDN), health and metrics."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from core import views as core_views
from core.sign_in import admin_sign_in
from core.views import docs_sign_in

api_v1 = [
    path("", include("agents.api.urls")),  # first: every agent calls /api/v1/agent/report/ every interval
    path("", include("core.api.urls")),
    path("", include("fleet.api.urls")),
    path("", include("sharing.api.urls")),
    path("", include("scheduling.api.urls")),
    path("", include("worker.api.urls")),
    path("", include("capacity.api.urls")),
    path("", include("manifests.api.urls")),
]

handler404 = core_views.page_not_found

urlpatterns = [
    # The API first: node agents call it every few seconds, and every UI pattern tried before costs them (bench B2).
    path("api/v1/", include(api_v1)),
    path("", include("console.urls")),
    path("", include("fleet.urls")),
    path("", include("core.urls")),
    path("", include("sharing.urls")),
    path("", include("scheduling.urls")),
    path("", include("worker.urls")),
    path("", include("capacity.urls")),
    path("admin/login/", admin_sign_in, name="admin_sign_in"),  # before admin's own: password sign-in may be off
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file: the Content-Security-Policy allows no inline script.
    path("api/docs/", docs_sign_in(SpectacularSwaggerSplitView.as_view(url_name="api-schema")), name="api-docs"),
    path("favicon.ico", core_views.favicon, name="favicon"),
    path("healthz", core_views.healthz, name="healthz"),
    path("readyz", core_views.readyz, name="readyz"),
    path("metrics", core_views.metrics, name="metrics"),
]
