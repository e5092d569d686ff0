"""Fleet routes under /api/v1/; route names are DRF's `<model>-list` and `<model>-detail`."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from fleet.api import agent_views, views

router = SimpleRouter()
router.register("clusters", views.ClusterViewSet)
router.register("node-pools", views.NodePoolViewSet)
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GpuViewSet)
router.register("mig-devices", views.MigDeviceViewSet)
router.register("agent-join-tokens", agent_views.AgentJoinTokenViewSet)
router.register("agent-credentials", agent_views.AgentCredentialViewSet)

urlpatterns = [
    # The node agent's endpoints (agent/protocol.py): a node credential, never a user. First: the most called.
    path("agent/report/", agent_views.AgentReportView.as_view(), name="agent-report"),
    path("agent/desired/", agent_views.AgentDesiredView.as_view(), name="agent-desired"),
    path("agent/outcome/", agent_views.AgentOutcomeView.as_view(), name="agent-outcome"),
    path("agent/register/", agent_views.AgentRegisterView.as_view(), name="agent-register"),
    *router.urls,
    path("nodes/<int:pk>/revoke-agent/", agent_views.NodeAgentRevokeView.as_view(), name="node-revoke-agent"),
]
