from django.urls import path

from console.views import compliance, config_import, kueue, nodes, overview, pools, preview, qos

app_name = "console"
urlpatterns = [
    path("", overview.overview, name="overview"),
    path("overview/stats/", overview.overview_stats, name="overview_stats"),
    path("nodes/<int:pk>/", nodes.node_detail, name="node_detail"),
    path("nodes/<int:pk>/state/", nodes.node_state, name="node_state"),
    path("nodes/<int:pk>/retry-now/", nodes.node_retry_now, name="node_retry_now"),
    path("uuid-conflicts/<int:pk>/resolve/", nodes.uuid_conflict_resolve_view, name="uuid_conflict_resolve"),
    path("gpus/<int:pk>/", nodes.gpu_detail, name="gpu_detail"),
    path("pools/new/", pools.pool_create, name="pool_create"),
    path("pools/members/", pools.pool_members, name="pool_members"),
    path("pools/<int:pk>/", pools.pool_detail, name="pool_detail"),
    path("pools/<int:pk>/edit/", pools.pool_update, name="pool_update"),
    path("pools/<int:pk>/delete/", pools.pool_delete, name="pool_delete"),
    path("pools/<int:pk>/kueue/", kueue.pool_kueue, name="pool_kueue"),
    path("pools/<int:pk>/kueue/take-over/", kueue.pool_kueue_take_over, name="pool_kueue_take_over"),
    path("clusters/<int:pk>/import/", config_import.cluster_import, name="cluster_import"),
    path("clusters/<int:pk>/import/confirm/", config_import.cluster_import_confirm, name="cluster_import_confirm"),
    path("profiles/<int:pk>/preview/", preview.profile_preview, name="profile_preview"),
    path("profiles/<int:pk>/assign/", preview.profile_assign, name="profile_assign"),
    path("profiles/<int:pk>/pin/", preview.profile_pin, name="profile_pin"),
    path("qos/", qos.qos_list, name="qos_list"),
    path("qos/new/", qos.qos_create, name="qos_create"),
    path("qos/validate/", qos.qos_validate, name="qos_validate"),
    path("qos/<int:pk>/", qos.qos_detail, name="qos_detail"),
    path("qos/<int:pk>/edit/", qos.qos_update, name="qos_update"),
    path("qos/<int:pk>/delete/", qos.qos_delete, name="qos_delete"),
    path("qos/<int:pk>/attach/", qos.qos_attach, name="qos_attach"),
    path("qos/<int:pk>/detach/", qos.qos_detach, name="qos_detach"),
    path("compliance/", compliance.compliance_list, name="compliance_list"),
    path("pools/<int:pk>/compliance/", compliance.pool_compliance, name="pool_compliance"),
    path("pools/<int:pk>/compliance/check/", compliance.pool_compliance_check, name="pool_compliance_check"),
]
