"""Capacity routes under /api/v1/."""

from django.urls import path

from capacity.api import views

urlpatterns = [path("gpu-hours/", views.GpuHoursView.as_view(), name="gpu-hours")]
