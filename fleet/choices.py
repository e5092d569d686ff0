"""Enumerations of the fleet app."""

from django.db import models


class ClusterDriver(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes (GPU Operator)"
    AGENT = "agent", "Tessera node agent"


class SharingMode(models.TextChoices):
    """How a GPU is shared: the four ways of the product."""

    PASSTHROUGH = "passthrough", "Passthrough (whole GPU)"
    MIG = "mig", "MIG"
    MPS = "mps", "MPS"
    TIME_SLICING = "time_slicing", "Time-slicing"


class ConfigState(models.TextChoices):
    """State of the node's sharing config as the node reports it (nvidia.com/mig.config.state or the agent)."""

    UNKNOWN = "unknown", "Unknown"
    PENDING = "pending", "Pending"
    APPLYING = "applying", "Applying"
    REBOOTING = "rebooting", "Rebooting"
    SUCCESS = "success", "Success"
    FAILED = "failed", "Failed"


class GpuHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    DEGRADED = "degraded", "Degraded"
    UNHEALTHY = "unhealthy", "Unhealthy"
    UNKNOWN = "unknown", "Unknown"


class ConnectionState(models.TextChoices):
    """A cluster's connection as Tessera last saw it."""

    NEVER = "never", "Never connected"
    OK = "ok", "Connected"
    ERROR = "error", "Error"
