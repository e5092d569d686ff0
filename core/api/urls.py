from django.urls import path
from rest_framework.routers import SimpleRouter

from core.api import views

router = SimpleRouter()
router.register("audit-events", views.AuditEventViewSet)

urlpatterns = [
    *router.urls,
    path("me/", views.MeView.as_view(), name="api-me"),
    path("me/token/rotate/", views.TokenRotateView.as_view(), name="api-token-rotate"),
]
