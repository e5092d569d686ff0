"""What a GPU should be: sharing profiles, a pool's default profile and per-node pins."""

from django.conf import settings
from django.db import models
from django.urls import reverse

from fleet.choices import SharingMode
from fleet.models import Node, NodePool
from sharing.choices import MigStrategy, TimeSliceInterval
from sharing.spec import ProfileSpec


class SharingProfile(models.Model):
    """How a node's GPUs are shared: one of the four modes and its parameters, checked against its GPU products."""

    name = models.CharField(max_length=100, unique=True)
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
        )


class PoolSharing(models.Model):
    """A pool's default sharing profile: what its nodes get when no pin and no schedule window says otherwise."""

    pool = models.OneToOneField(NodePool, on_delete=models.CASCADE, related_name="sharing")
    profile = models.ForeignKey(SharingProfile, on_delete=models.PROTECT, related_name="pools")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.pool} → {self.profile}"


class NodePin(models.Model):
    """A node pinned to a profile, overriding its pool and schedule (e.g. a node kept whole for a long job)."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="pin")
    profile = models.ForeignKey(SharingProfile, on_delete=models.PROTECT, related_name="pins")
    reason = models.CharField(max_length=300, blank=True)
    pinned_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.node} ⇒ {self.profile}"
