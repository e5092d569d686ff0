from django.urls import path

from fleet import views

app_name = "fleet"
urlpatterns = [
    path("clusters/", views.cluster_list, name="cluster_list"),
    path("clusters/<int:pk>/", views.cluster_detail, name="cluster_detail"),
    path("pools/", views.pool_list, name="pool_list"),
    path("nodes/", views.node_list, name="node_list"),
    path("nodes/<int:pk>/agent/revoke/", views.node_agent_revoke, name="node_agent_revoke"),
    path("gpus/", views.gpu_list, name="gpu_list"),
    path("agents/tokens/", views.agent_token_list, name="agent_token_list"),
    path("agents/tokens/<int:pk>/revoke/", views.agent_token_revoke, name="agent_token_revoke"),
    path("agents/pending/<int:pk>/approve/", views.pending_agent_decide, {"approve": True}, name="pending_approve"),
    path("agents/pending/<int:pk>/reject/", views.pending_agent_decide, {"approve": False}, name="pending_reject"),
]
