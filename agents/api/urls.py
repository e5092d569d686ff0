"""Agent routes under /api/v1/: the node agent's endpoints (agent/protocol.py) and their admin; route names as
DRF's routers make them (`agentjointoken-list`...)."""

from django.urls import path
from rest_framework.routers import SimpleRouter

from agents.api import views

router = SimpleRouter()
router.register("agent-join-tokens", views.AgentJoinTokenViewSet)
router.register("agent-credentials", views.AgentCredentialViewSet)
router.register("pending-agents", views.PendingAgentViewSet)
router.register("uuid-conflicts", views.UuidConflictViewSet)

urlpatterns = [
    # The node agent's endpoints (agent/protocol.py): a node credential, never a user. First: the most called.
    path("agent/report/", views.AgentReportView.as_view(), name="agent-report"),
    path("agent/desired/", views.AgentDesiredView.as_view(), name="agent-desired"),
    path("agent/outcome/", views.AgentOutcomeView.as_view(), name="agent-outcome"),
    path("agent/register/", views.AgentRegisterView.as_view(), name="agent-register"),
    *router.urls,
    path("nodes/<int:pk>/revoke-agent/", views.NodeAgentRevokeView.as_view(), name="node-revoke-agent"),
]
