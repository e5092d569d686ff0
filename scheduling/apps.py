from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    """Schedules of windows per pool and the evaluation of desired state at a time."""

    name = "scheduling"
