"""Scheduling routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduling.api import views

router = SimpleRouter()
router.register("schedules", views.ScheduleViewSet)
router.register("desired-states", views.DesiredStateViewSet, basename="desired-state")

urlpatterns = [
    path("transitions/", views.UpcomingTransitionsView.as_view(), name="transitions"),
    path("profiles/<int:pk>/preview/", views.ProfilePreviewView.as_view(), name="sharingprofile-preview"),
    *router.urls,
]
