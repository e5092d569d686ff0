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
    path("nodes/<int:pk>/pin/", views.node_pin, name="node_pin"),
    path("nodes/<int:pk>/unpin/", views.node_unpin, name="node_unpin"),
]
