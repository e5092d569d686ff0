"""A compact history per pool, one row per sample and resource (and per namespace and team for usage): what the
pool offered and held, what waited and for how long, how busy its slices were. Sampled every
TESSERA["CAPACITY"]["SAMPLE_MINUTES"] by beat (capacity.sampling), kept TESSERA["RETENTION"]["DEMAND_DAYS"]."""

from django.db import models

from fleet.models import NodePool


class DemandSource(models.TextChoices):
    PODS = "pods", "Pods"
    WORKLOADS = "workloads", "Kueue Workloads"


class DemandSample(models.Model):
    """One resource of one pool at one sample instant (`at`, the start of the sample's bucket).

    Pods: `capacity` and `used` in units of the resource (slices, GPUs, shares), `used_gpus` weighted by each unit's
    share of a GPU. Waiting: `pending` pods (`pending_units` asked), the oldest's wait so far. Pods created in the
    bucket before it (`arrived`), pods a node took in it (`started`, of which within 5 minutes of their creation
    `started_within_5min`, their waits summed). Utilisation and memory in use: DCGM's averages over the pool's
    slices (or whole GPUs) of this resource. Kueue Workloads (source `workloads`) fill only the waiting fields.
    """

    pool = models.ForeignKey(NodePool, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    seconds = models.PositiveIntegerField(help_text="How long this sample stands for: the sampling interval.")
    source = models.CharField(max_length=10, choices=DemandSource.choices, default=DemandSource.PODS)
    resource = models.CharField(max_length=100)
    capacity = models.PositiveIntegerField(default=0)
    used = models.PositiveIntegerField(default=0)
    used_gpus = models.FloatField(default=0)
    gpu_share = models.FloatField(default=1, help_text="One unit's share of a GPU (a 3g slice of 7: 3/7).")
    pending = models.PositiveIntegerField(default=0)
    pending_units = models.PositiveIntegerField(default=0)
    pending_wait_max_s = models.PositiveIntegerField(default=0)
    arrived = models.PositiveIntegerField(default=0)
    arrived_units = models.PositiveIntegerField(default=0)
    started = models.PositiveIntegerField(default=0)
    started_within_5min = models.PositiveIntegerField(default=0)
    started_wait_s = models.FloatField(default=0)
    utilization_pct = models.FloatField(null=True, blank=True)
    memory_used_pct = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["pool", "at", "resource"]
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "at", "source", "resource"], name="%(app_label)s_%(class)s_one_per_sample"
            ),
        ]
        # The unique constraint's index, led by (pool, at), serves the week query of one pool.

    def __str__(self):
        return f"{self.pool_id}@{self.at:%Y-%m-%d %H:%M} {self.resource}"


class UsageSample(models.Model):
    """What one namespace (and team: the value of the label TESSERA["CAPACITY"]["TEAM_LABEL"]) held of one resource
    in one pool at one sample: `units`, and `gpus`, the units weighted by their share of a GPU. GPU-hours are
    gpus × seconds / 3600 summed over samples."""

    pool = models.ForeignKey(NodePool, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    seconds = models.PositiveIntegerField()
    namespace = models.CharField(max_length=253)
    team = models.CharField(max_length=63, blank=True)
    resource = models.CharField(max_length=100)
    units = models.PositiveIntegerField()
    gpus = models.FloatField()

    class Meta:
        ordering = ["pool", "at", "namespace", "team", "resource"]
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "at", "namespace", "team", "resource"], name="%(app_label)s_%(class)s_one_per_sample"
            ),
        ]
        indexes = [models.Index(fields=["at"])]  # GPU-hours over every pool by time range

    def __str__(self):
        return f"{self.pool_id}@{self.at:%Y-%m-%d %H:%M} {self.namespace} {self.resource}"
