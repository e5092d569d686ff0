from django.urls import path

from sharing import views

app_name = "sharing"
urlpatterns = [
    path("profiles/", views.profile_list, name="profile_list"),
    path("profiles/new/", views.profile_create, name="profile_create"),
    path("profiles/validate/", views.profile_validate, name="profile_validate"),
    path("profiles/<int:pk>/", views.profile_detail, name="profile_detail"),
    path("profiles/<int:pk>/edit/", views.profile_update, name="profile_update"),
    path("profiles/<int:pk>/delete/", views.profile_delete, name="profile_delete"),
    path("profiles/<int:pk>/preview/", views.profile_preview, name="profile_preview"),
    path("profiles/<int:pk>/assign/", views.profile_assign, name="profile_assign"),
    path("profiles/<int:pk>/pin/", views.profile_pin, name="profile_pin"),
    path("nodes/<int:pk>/pin/", views.node_pin, name="node_pin"),
    path("nodes/<int:pk>/unpin/", views.node_unpin, name="node_unpin"),
    path("qos/", views.qos_list, name="qos_list"),
    path("qos/new/", views.qos_create, name="qos_create"),
    path("qos/validate/", views.qos_validate, name="qos_validate"),
    path("qos/<int:pk>/", views.qos_detail, name="qos_detail"),
    path("qos/<int:pk>/edit/", views.qos_update, name="qos_update"),
    path("qos/<int:pk>/delete/", views.qos_delete, name="qos_delete"),
    path("qos/<int:pk>/attach/", views.qos_attach, name="qos_attach"),
    path("qos/<int:pk>/detach/", views.qos_detach, name="qos_detach"),
    path("compliance/", views.compliance_list, name="compliance_list"),
    path("pools/<int:pk>/compliance/", views.pool_compliance, name="pool_compliance"),
    path("pools/<int:pk>/compliance/check/", views.pool_compliance_check, name="pool_compliance_check"),
]
