from django.apps import AppConfig


class SharingConfig(AppConfig):
    """What a GPU should be: sharing profiles, QoS policies, the MIG catalog and NVIDIA config rendering."""

    name = "sharing"

    def ready(self):
        from core import metrics
        from sharing.metrics import ComplianceCollector

        metrics.register("sharing", ComplianceCollector())
