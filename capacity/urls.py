from django.urls import path

from capacity import views

app_name = "capacity"
urlpatterns = [
    path("pools/<int:pk>/capacity/", views.pool_capacity, name="pool_capacity"),
    path("pools/<int:pk>/capacity/draft/", views.pool_capacity_draft, name="pool_capacity_draft"),
    path("gpu-hours/", views.gpu_hours, name="gpu_hours"),
]
