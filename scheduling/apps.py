from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    """Schedules of windows per pool and the evaluation of desired state at a time."""

    name = "scheduling"

    def ready(self):
        from core import metrics
        from scheduling.metrics import ScheduleCollector

        metrics.register("scheduling", ScheduleCollector())
