"""Fleet routes under /api/v1/; route names are DRF's `<model>-list` and `<model>-detail`."""

from rest_framework.routers import SimpleRouter

from fleet.api import views

router = SimpleRouter()
router.register("clusters", views.ClusterViewSet)
router.register("node-pools", views.NodePoolViewSet)
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GpuViewSet)
router.register("mig-devices", views.MigDeviceViewSet)

urlpatterns = router.urls
