from django.apps import AppConfig


class CapacityConfig(AppConfig):
    """Demand and usage recorded per pool, the layouts that would have served it, GPU-hours per team."""

    name = "capacity"
