"""What a GPU should be: sharing profiles, a pool's default profile and per-node pins."""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse

from core.fields import NameField
from fleet.choices import SharingMode
from fleet.models import Node, NodePool
from sharing.choices import (
    ComputeMode,
    CpuGovernor,
    CpuManagerPolicy,
    MigStrategy,
    RequiredQoS,
    TimeSliceInterval,
    TopologyManagerPolicy,
    TransparentHugePages,
)
from sharing.qos import PolicySpec, WorkloadRules
from sharing.spec import KeptConfigs, ProfileSpec


class SharingProfile(models.Model):
    """How a node's GPUs are shared: one of the four modes and its parameters, checked against its GPU products."""

    name = NameField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    mode = models.CharField(max_length=20, choices=SharingMode.choices)
    target_products = models.JSONField(default=list, help_text="GPU Feature Discovery product names it is for.")
    mig_layouts = models.JSONField(
        default=dict, blank=True, help_text='"all" or a GPU index -> {profile: count}, or null for MIG off.'
    )
    mig_strategy = models.CharField(max_length=10, choices=MigStrategy.choices, default=MigStrategy.MIXED)
    replicas = models.PositiveSmallIntegerField(default=1)
    mps_active_thread_percentage = models.PositiveSmallIntegerField(null=True, blank=True)
    mps_pinned_memory_limit_mib = models.PositiveIntegerField(null=True, blank=True)
    rename_shared = models.BooleanField(default=False)
    fail_requests_greater_than_one = models.BooleanField(default=False)
    time_slice_interval = models.CharField(
        max_length=10, choices=TimeSliceInterval.choices, default=TimeSliceInterval.DEFAULT
    )
    imported = models.JSONField(
        default=dict,
        blank=True,
        help_text="The cluster configs this profile was imported from, kept under their names (sharing.spec."
        "KeptConfigs); emptied when the profile's meaning changes.",
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("sharing:profile_detail", args=[self.pk])

    def to_spec(self) -> ProfileSpec:
        return ProfileSpec(
            mode=self.mode,
            target_products=tuple(self.target_products),
            mig_layouts=self.mig_layouts,
            mig_strategy=self.mig_strategy,
            replicas=self.replicas,
            mps_active_thread_percentage=self.mps_active_thread_percentage,
            mps_pinned_memory_limit_mib=self.mps_pinned_memory_limit_mib,
            rename_shared=self.rename_shared,
            fail_requests_greater_than_one=self.fail_requests_greater_than_one,
            time_slice_interval=self.time_slice_interval,
            kept=KeptConfigs.from_json(self.imported),
        )


class PoolSharing(models.Model):
    """A pool's defaults: the sharing profile and QoS policy its nodes get when no pin or schedule window says
    otherwise."""

    pool = models.OneToOneField(NodePool, on_delete=models.CASCADE, related_name="sharing")
    profile = models.ForeignKey(SharingProfile, on_delete=models.PROTECT, related_name="pools", null=True, blank=True)
    qos_policy = models.ForeignKey("QoSPolicy", on_delete=models.PROTECT, related_name="pools", null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.pool} → {self.profile}"


class NodePinQuerySet(models.QuerySet):
    def in_force(self, at):
        """Pins that count at instant `at`: without an end, or ending after it."""
        return self.filter(Q(until__isnull=True) | Q(until__gt=at))


class NodePin(models.Model):
    """A node pinned to a profile, overriding its pool and schedule (e.g. a node kept whole for a long job)."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="pin")
    profile = models.ForeignKey(SharingProfile, on_delete=models.PROTECT, related_name="pins")
    reason = models.CharField(max_length=300, blank=True)
    until = models.DateTimeField(
        null=True,
        blank=True,
        db_index=True,
        help_text="The pin stops counting at this instant (the reconcile tick then removes it); empty: until unpinned.",
    )
    pinned_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = NodePinQuerySet.as_manager()

    def __str__(self):
        return f"{self.node} ⇒ {self.profile}"


class QoSPolicy(models.Model):
    """How work on a pool must behave: workload rules checked against observed pods, GPU settings and host
    tuning applied by agents, and kubelet settings expected (read, never changed)."""

    name = NameField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    # Workload rules
    required_qos = models.CharField(max_length=12, choices=RequiredQoS.choices, default=RequiredQoS.ANY)
    required_priority_class = models.CharField(max_length=253, blank=True)
    max_pods_per_gpu = models.PositiveSmallIntegerField(null=True, blank=True)
    exclusive_taint = models.CharField(max_length=300, blank=True, help_text="key=value:NoSchedule")
    requires_memory_isolation = models.BooleanField(default=False)
    enforce_admission = models.BooleanField(
        default=False, help_text="Also enforce the QoS and priority rules with a ValidatingAdmissionPolicy."
    )
    # GPU settings (agents apply them)
    persistence_mode = models.BooleanField(null=True, blank=True)
    compute_mode = models.CharField(max_length=20, choices=ComputeMode.choices, blank=True)
    time_slice_interval = models.CharField(max_length=10, choices=TimeSliceInterval.choices, blank=True)
    mps_active_thread_percentage = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    mps_pinned_memory_limit_mib = models.PositiveIntegerField(null=True, blank=True)
    gpu_clock_min_mhz = models.PositiveIntegerField(null=True, blank=True)
    gpu_clock_max_mhz = models.PositiveIntegerField(null=True, blank=True)
    power_limit_w = models.PositiveIntegerField(null=True, blank=True)
    # Host tuning (agents apply them)
    transparent_hugepages = models.CharField(max_length=10, choices=TransparentHugePages.choices, blank=True)
    swappiness = models.PositiveSmallIntegerField(null=True, blank=True, validators=[MaxValueValidator(200)])
    cpu_governor = models.CharField(max_length=20, choices=CpuGovernor.choices, blank=True)
    dirty_ratio = models.PositiveSmallIntegerField(null=True, blank=True, validators=[MaxValueValidator(100)])
    dirty_background_ratio = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(100)]
    )
    # Kubelet expectations (compared with what each node runs)
    topology_manager_policy = models.CharField(max_length=20, choices=TopologyManagerPolicy.choices, blank=True)
    cpu_manager_policy = models.CharField(max_length=10, choices=CpuManagerPolicy.choices, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "QoS policy"
        verbose_name_plural = "QoS policies"
        constraints = [
            models.CheckConstraint(
                condition=Q(swappiness__isnull=True) | Q(swappiness__lte=200),
                name="%(app_label)s_%(class)s_swappiness_range",
            ),
            models.CheckConstraint(
                condition=Q(mps_active_thread_percentage__isnull=True)
                | Q(mps_active_thread_percentage__gte=1, mps_active_thread_percentage__lte=100),
                name="%(app_label)s_%(class)s_thread_percentage_range",
            ),
            models.CheckConstraint(
                condition=Q(dirty_ratio__isnull=True) | Q(dirty_ratio__lte=100),
                name="%(app_label)s_%(class)s_dirty_ratio_range",
            ),
            models.CheckConstraint(
                condition=Q(dirty_background_ratio__isnull=True) | Q(dirty_background_ratio__lte=100),
                name="%(app_label)s_%(class)s_dirty_background_ratio_range",
            ),
        ]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("console:qos_detail", args=[self.pk])

    def workload_rules(self) -> WorkloadRules:
        return WorkloadRules(
            required_qos=self.required_qos,
            required_priority_class=self.required_priority_class,
            max_pods_per_gpu=self.max_pods_per_gpu,
            exclusive_taint=self.exclusive_taint,
        )

    def to_policy_spec(self) -> PolicySpec:
        return PolicySpec(
            requires_memory_isolation=self.requires_memory_isolation,
            mps_active_thread_percentage=self.mps_active_thread_percentage,
            mps_pinned_memory_limit_mib=self.mps_pinned_memory_limit_mib,
            time_slice_interval=self.time_slice_interval,
            required_qos=self.required_qos,
        )

    def node_settings(self) -> dict:
        """GPU settings and host tuning an agent applies, only those the policy sets (JSON)."""
        gpu = {
            "persistence_mode": self.persistence_mode,
            "compute_mode": self.compute_mode or None,
            "time_slice_interval": self.time_slice_interval or None,
            "mps_active_thread_percentage": self.mps_active_thread_percentage,
            "mps_pinned_memory_limit_mib": self.mps_pinned_memory_limit_mib,
            "gpu_clock_min_mhz": self.gpu_clock_min_mhz,
            "gpu_clock_max_mhz": self.gpu_clock_max_mhz,
            "power_limit_w": self.power_limit_w,
        }
        host = {
            "transparent_hugepages": self.transparent_hugepages or None,
            "swappiness": self.swappiness,
            "cpu_governor": self.cpu_governor or None,
            "dirty_ratio": self.dirty_ratio,
            "dirty_background_ratio": self.dirty_background_ratio,
        }
        return {
            "gpu": {k: v for k, v in gpu.items() if v is not None},
            "host": {k: v for k, v in host.items() if v is not None},
        }


class QoSComplianceReport(models.Model):
    """The last compliance check of a pool: which observed pods break which rule of its current policy."""

    pool = models.OneToOneField(NodePool, on_delete=models.CASCADE, related_name="qos_compliance")
    policy = models.ForeignKey(QoSPolicy, on_delete=models.SET_NULL, null=True, related_name="+")
    checked_at = models.DateTimeField()
    pods_checked = models.PositiveIntegerField(default=0)
    violation_count = models.PositiveIntegerField(default=0)
    violations = models.JSONField(default=list, help_text="[{namespace, name, node, rule, message}]")
    kubelet_mismatches = models.JSONField(default=list, help_text="[{node, setting, expected, actual}]")

    def __str__(self):
        return f"{self.pool}: {self.violation_count} violation(s)"
