"""Enumerations of the fleet app."""

from django.db import models


class ClusterDriver(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes (GPU Operator)"
    AGENT = "agent", "Tessera node agent"


class ClusterMigStrategy(models.TextChoices):
    """The device plugin's MIG strategy as the GPU Operator sets it from ClusterPolicy spec.mig.strategy (contracts
    §1.2); NOT_SET leaves each node's device-plugin config in charge."""

    NOT_SET = "", "Not set (each node's device-plugin config decides)"
    NONE = "none", "none (MIG devices not advertised)"
    SINGLE = "single", "single (MIG devices as nvidia.com/gpu, one profile per node)"
    MIXED = "mixed", "mixed (nvidia.com/mig-<profile> resources; no MPS)"


class SharingMode(models.TextChoices):
    """How a GPU is shared: the four ways of the product."""

    PASSTHROUGH = "passthrough", "Passthrough (whole GPU)"
    MIG = "mig", "MIG"
    MPS = "mps", "MPS"
    TIME_SLICING = "time_slicing", "Time-slicing"


class GpuStack(models.TextChoices):
    """What serves a node's GPUs to pods (docs/nvidia-contracts.md §13; values of sharing.dra): read from the
    cluster at each full inventory sync."""

    UNKNOWN = "", "Unknown"
    DEVICE_PLUGIN = "device_plugin", "Device plugin (ClusterPolicy)"
    DRA_CLUSTER_POLICY = "dra_clusterpolicy", "NVIDIA DRA driver (ClusterPolicy)"
    DRA_GPU_CLUSTER = "dra_gpucluster", "NVIDIA DRA driver (GPUCluster)"


DRA_STACKS = (GpuStack.DRA_CLUSTER_POLICY, GpuStack.DRA_GPU_CLUSTER)


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


UNHEALTHY_STATES = (GpuHealth.DEGRADED, GpuHealth.UNHEALTHY)  # a GPU in need of attention


class ConnectionState(models.TextChoices):
    """A cluster's connection as Tessera last saw it."""

    NEVER = "never", "Never connected"
    OK = "ok", "Connected"
    ERROR = "error", "Error"
