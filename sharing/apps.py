from django.apps import AppConfig


class SharingConfig(AppConfig):
    """What a GPU should be: sharing profiles, QoS policies, the MIG catalog and NVIDIA config rendering."""

    name = "sharing"
