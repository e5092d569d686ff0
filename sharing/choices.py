"""Enumerations of the sharing app."""

from django.db import models


class MigStrategy(models.TextChoices):
    SINGLE = "single", "Single (every GPU alike, MIG devices as nvidia.com/gpu)"
    MIXED = "mixed", "Mixed (nvidia.com/mig-<profile> resources)"


class TimeSliceInterval(models.TextChoices):
    DEFAULT = "default", "Default"
    SHORT = "short", "Short"
    MEDIUM = "medium", "Medium"
    LONG = "long", "Long"


class BusyPolicy(models.TextChoices):
    """What to do when a MIG change meets pods holding GPUs on the node (MIG Manager never drains, §1.2)."""

    WAIT = "wait", "Wait until idle (up to the wait limit)"
    DRAIN = "drain", "Cordon and evict the pods"
    SKIP = "skip", "Skip the node"
    FORCE = "force", "Apply anyway"
