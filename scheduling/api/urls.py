"""Scheduling routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from scheduling.api import views

router = SimpleRouter()
router.register("schedules", views.ScheduleViewSet)
router.register("desired-states", views.DesiredStateViewSet, basename="desired-state")

urlpatterns = [path("transitions/", views.UpcomingTransitionsView.as_view(), name="transitions"), *router.urls]
