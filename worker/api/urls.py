"""Worker routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from worker.api import views

router = SimpleRouter()
router.register("rollouts", views.RolloutViewSet)
router.register("node-changes", views.NodeChangeViewSet)
router.register("node-retries", views.NodeRetryViewSet)
router.register("admission-policies", views.AdmissionPolicyStateViewSet)
router.register("kueue-bindings", views.KueueBindingViewSet)

urlpatterns = [
    *router.urls,
    path("profiles/<int:pk>/assign/", views.ProfileAssignView.as_view(), name="sharingprofile-assign"),
    path("clusters/<int:pk>/nvidia-import/", views.ClusterConfigImportView.as_view(), name="cluster-nvidia-import"),
]
