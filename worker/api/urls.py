"""Worker routes under /api/v1/."""

from rest_framework.routers import SimpleRouter

from worker.api import views

router = SimpleRouter()
router.register("rollouts", views.RolloutViewSet)
router.register("node-changes", views.NodeChangeViewSet)
router.register("admission-policies", views.AdmissionPolicyStateViewSet)

urlpatterns = router.urls
