from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Inventory: clusters, pools, nodes, GPUs and MIG devices as observed."""

    name = "fleet"

    def ready(self):
        from core.metrics import REGISTRY
        from fleet.metrics import FleetCollector

        REGISTRY.register(FleetCollector())
