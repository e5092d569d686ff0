from django.urls import path

from scheduling import views

app_name = "scheduling"
urlpatterns = [
    path("schedules/", views.schedule_list, name="schedule_list"),
    path("schedules/new/", views.schedule_create, name="schedule_create"),
    path("schedules/day-night/", views.schedule_daynight, name="schedule_daynight"),
    path("schedules/timeline/", views.schedule_timeline, name="schedule_timeline"),
    path("schedules/<int:pk>/", views.schedule_detail, name="schedule_detail"),
    path("schedules/<int:pk>/edit/", views.schedule_update, name="schedule_update"),
    path("schedules/<int:pk>/delete/", views.schedule_delete, name="schedule_delete"),
]
