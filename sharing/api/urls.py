"""Sharing routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from sharing.api import views

router = SimpleRouter()
router.register("profiles", views.SharingProfileViewSet)
router.register("node-pins", views.NodePinViewSet)
router.register("qos-policies", views.QoSPolicyViewSet)
router.register("qos-compliance", views.QoSComplianceViewSet)

urlpatterns = [
    path("mig/validate/", views.MigValidateView.as_view(), name="mig-validate"),
    path("mig/products/", views.MigProductsView.as_view(), name="mig-products"),
    *router.urls,
]
