from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Inventory: clusters, pools, nodes, GPUs and MIG devices as observed."""

    name = "fleet"

    def ready(self):
        from core import metrics
        from fleet.metrics import FleetCollector

        metrics.register("fleet", FleetCollector())
