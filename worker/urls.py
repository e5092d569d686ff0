from django.urls import path

from worker import views

app_name = "worker"
urlpatterns = [
    path("rollouts/", views.rollout_list, name="rollout_list"),
    path("rollouts/<int:pk>/", views.rollout_detail, name="rollout_detail"),
    path("rollouts/<int:pk>/live/", views.rollout_live, name="rollout_live"),
    path("rollouts/<int:pk>/pause/", views.rollout_pause, name="rollout_pause"),
    path("rollouts/<int:pk>/resume/", views.rollout_resume, name="rollout_resume"),
    path("rollouts/<int:pk>/cancel/", views.rollout_cancel, name="rollout_cancel"),
    path("rollouts/<int:pk>/retry-now/", views.rollout_retry_now, name="rollout_retry_now"),
]
