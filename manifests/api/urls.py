"""Config-as-code routes under /api/v1/config/."""

from django.urls import path

from manifests.api import views

urlpatterns = [
    path("config/documents/", views.ConfigDocumentsView.as_view(), name="config-documents"),
    path("config/schema/", views.ConfigSchemaView.as_view(), name="config-schema"),
    path("config/plan/", views.ConfigPlanView.as_view(), name="config-plan"),
    path("config/apply/", views.ConfigApplyView.as_view(), name="config-apply"),
]
