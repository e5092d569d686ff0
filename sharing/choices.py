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
