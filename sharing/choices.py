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


class FailurePolicy(models.TextChoices):
    """What a rollout does when a canary fails, or its failed nodes reach max_failures."""

    FAIL = "fail", "Fail the rollout"
    PAUSE = "pause", "Pause it for a person"


class RequiredQoS(models.TextChoices):
    ANY = "any", "Any"
    BURSTABLE = "burstable", "Burstable or Guaranteed"
    GUARANTEED = "guaranteed", "Guaranteed only"


class ComputeMode(models.TextChoices):
    DEFAULT = "default", "Default"
    EXCLUSIVE_PROCESS = "exclusive_process", "Exclusive process"
    PROHIBITED = "prohibited", "Prohibited"


class TransparentHugePages(models.TextChoices):
    ALWAYS = "always", "always"
    MADVISE = "madvise", "madvise"
    NEVER = "never", "never"


class CpuGovernor(models.TextChoices):
    PERFORMANCE = "performance", "performance"
    POWERSAVE = "powersave", "powersave"
    ONDEMAND = "ondemand", "ondemand"
    SCHEDUTIL = "schedutil", "schedutil"


class TopologyManagerPolicy(models.TextChoices):
    NONE = "none", "none"
    BEST_EFFORT = "best-effort", "best-effort"
    RESTRICTED = "restricted", "restricted"
    SINGLE_NUMA_NODE = "single-numa-node", "single-numa-node"


class CpuManagerPolicy(models.TextChoices):
    NONE = "none", "none"
    STATIC = "static", "static"
