"""Rollouts: how desired state reaches nodes, one NodeChange per node, every transition stored before it acts; and
the admission policies Tessera keeps in Kubernetes clusters for QoS policies enforced at admission."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from fleet.models import Cluster, Node, NodePool
from sharing.choices import BusyPolicy, FailurePolicy
from sharing.models import QoSPolicy, SharingProfile
from worker.choices import ACTIVE_CHANGE_STATUSES, ChangeStatus, RolloutStatus, RolloutTrigger
from worker.querysets import RolloutQuerySet


class Rollout(models.Model):
    """A set of node changes toward desired state, with its strategy (batches, canary, failure stop) and status."""

    title = models.CharField(max_length=300)
    trigger = models.CharField(max_length=10, choices=RolloutTrigger.choices)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    actor_label = models.CharField(max_length=200)
    pool = models.ForeignKey(NodePool, on_delete=models.SET_NULL, null=True, blank=True, related_name="rollouts")
    profile = models.ForeignKey(SharingProfile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    batch_size = models.PositiveIntegerField(default=10, help_text="Nodes changing at once (max unavailable).")
    canary_count = models.PositiveIntegerField(default=1, help_text="Nodes that must succeed before the rest start.")
    max_failures = models.PositiveIntegerField(default=1, help_text="Stop the rollout after this many failed nodes.")
    on_failure = models.CharField(
        max_length=5,
        choices=FailurePolicy.choices,
        default=FailurePolicy.FAIL,
        help_text="What a failed canary, or max_failures failed nodes, does to the rollout.",
    )
    accepted_failures = models.PositiveIntegerField(
        default=0, help_text="Failed nodes a person accepted by resuming the rollout; only later ones stop it again."
    )
    busy_policy = models.CharField(max_length=10, choices=BusyPolicy.choices, default=BusyPolicy.WAIT)
    wait_minutes = models.PositiveIntegerField(default=30, help_text="How long to wait for busy GPUs or a drain.")
    verify_timeout_seconds = models.PositiveIntegerField(
        default=600, help_text="`pending` longer than this counts as failed (the MIG Manager can wedge)."
    )
    max_attempts = models.PositiveSmallIntegerField(default=2)
    status = models.CharField(max_length=10, choices=RolloutStatus.choices, default=RolloutStatus.RUNNING)
    superseded_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
        help_text="The rollout that took over this one's nodes when a newer desired state superseded it.",
    )  # fmt: skip
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = RolloutQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.CheckConstraint(condition=Q(batch_size__gte=1), name="%(app_label)s_%(class)s_batch_at_least_one"),
            models.CheckConstraint(
                condition=Q(max_failures__gte=1), name="%(app_label)s_%(class)s_max_failures_at_least_one"
            ),
        ]

    def __str__(self):
        return f"#{self.pk} {self.title}"

    def get_absolute_url(self):
        return reverse("worker:rollout_detail", args=[self.pk])


class NodeChange(models.Model):
    """One node's step in a rollout: from which configs to which, its state machine, attempts and last error."""

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="changes")
    # PROTECT: a gone node stays while a kept rollout names it (fleet.retention deletes only unreferenced nodes).
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="changes")
    position = models.PositiveIntegerField(help_text="Order within the rollout; the first ones are the canaries.")
    profile = models.ForeignKey(SharingProfile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    from_config = models.JSONField(default=dict, help_text="What the node ran before: the rollback target.")
    to_config = models.JSONField(default=dict, help_text="Config names and contents to apply, expected resources.")
    status = models.CharField(max_length=20, choices=ChangeStatus.choices, default=ChangeStatus.QUEUED)
    attempts = models.PositiveSmallIntegerField(default=0)
    applied_mig_config = models.CharField(max_length=253, blank=True, help_text="The label value actually written.")
    cordoned_by_tessera = models.BooleanField(default=False)
    drain_started_at = models.DateTimeField(
        null=True, blank=True, help_text="First eviction; from then GPUs may take the verify timeout to go idle."
    )
    deadline = models.DateTimeField(null=True, blank=True, help_text="When waiting or verifying gives up.")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    status_since = models.DateTimeField(
        default=timezone.now, help_text="When the change entered its status: the start of the phase it is in."
    )
    updated_at = models.DateTimeField(auto_now=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["rollout", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(status__in=ACTIVE_CHANGE_STATUSES),
                name="%(app_label)s_%(class)s_one_active_per_node",
            ),
            models.UniqueConstraint(fields=["rollout", "node"], name="%(app_label)s_%(class)s_node_once_per_rollout"),
        ]
        indexes = [models.Index(fields=["rollout", "status"]), models.Index(fields=["node", "-updated_at"])]

    def __str__(self):
        return f"{self.node} in rollout #{self.rollout_id}: {self.status}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_CHANGE_STATUSES


class NodeRetry(models.Model):
    """When the reconcile loop next tries a config on a node whose change to it failed, or that a stopped rollout
    held back with the node that failed: the loop skips the node until `next_retry_at`, which doubles with each
    failure (settings RETRY_BACKOFF_SECONDS up to RETRY_BACKOFF_MAX_SECONDS). A success deletes the row; "retry
    now" sets `next_retry_at` to now. A row whose `config_id` is no longer desired holds nothing back."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="retry")
    config_id = models.CharField(max_length=253, help_text="The config that failed (NodeChange.to_config.config_id).")
    failures = models.PositiveSmallIntegerField(
        default=0, help_text="Failed changes of this node to this config in a row; 0: held back, never failed."
    )
    next_retry_at = models.DateTimeField(db_index=True)
    rollout = models.ForeignKey(Rollout, on_delete=models.SET_NULL, null=True, blank=True, related_name="retries")
    error = models.TextField(blank=True, help_text="Why: the failure, or which node's failure held this one back.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.node_id}: {self.config_id} after {self.failures} failure(s), next {self.next_retry_at}"

    @property
    def held(self) -> bool:
        return self.failures == 0


class AdmissionState(models.TextChoices):
    APPLIED = "applied", "Applied"
    ERROR = "error", "Error"
    REMOVING = "removing", "Removing"
    NOT_APPLICABLE = "not_applicable", "Not applicable"


class AdmissionPolicyState(models.Model):
    """One pool's QoS policy enforced at admission: the ValidatingAdmissionPolicy and binding (both `object_name`)
    Tessera keeps in the pool's cluster, the manifest last applied or attempted, when, and the last error. A row of a
    pool that no longer enforces (or is gone) stays, `removing`, until its objects are deleted."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="admission_policies")
    pool = models.ForeignKey(
        NodePool, on_delete=models.SET_NULL, null=True, blank=True, related_name="admission_policies"
    )
    pool_name = models.CharField(max_length=100)
    qos_policy = models.ForeignKey(QoSPolicy, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    policy_name = models.CharField(max_length=100, blank=True)
    object_name = models.CharField(max_length=253, blank=True)
    state = models.CharField(max_length=20, choices=AdmissionState.choices)
    manifest = models.TextField(blank=True, help_text="The policy and binding as YAML (no credentials in them).")
    manifest_hash = models.CharField(
        max_length=64, blank=True, help_text="sha256 of the manifest; the objects carry it as an annotation."
    )
    resource_versions = models.JSONField(default=dict, blank=True, help_text="{policy, binding} as last seen live.")
    applied_at = models.DateTimeField(null=True, blank=True, help_text="When the cluster first held this manifest.")
    checked_at = models.DateTimeField(null=True, blank=True, help_text="The last pass that reached the API server.")
    error = models.TextField(blank=True)
    error_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "pool_name", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "pool"], name="%(app_label)s_%(class)s_one_per_pool"),
        ]

    def __str__(self):
        return f"{self.cluster.name}/{self.pool_name}: {self.object_name or '-'} ({self.state})"


# --- what /metrics and /readyz read: written by the process that did the work, read by whichever serves them --------


class NodeDrift(models.Model):
    """A node whose observed config differs from its desired one, as the last reconcile pass that evaluated it saw it:
    since when, and why it is not in sync yet. Rows of nodes back in sync are deleted by the next pass (every tick
    evaluates the nodes recorded here again)."""

    class Reason(models.TextChoices):
        PLANNED = "planned", "No change yet: the loop starts one"
        CHANGING = "changing", "A change is in progress"
        FAILED = "failed", "The last change to this config failed: retried after a back-off"
        HELD = "held", "Held back with a node of its rollout that failed: retried with it"
        INVALID = "invalid", "The desired profile does not fit the node's GPUs"

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="drift")
    reason = models.CharField(max_length=10, choices=Reason.choices)
    since = models.DateTimeField(help_text="When a pass first saw the node differ (kept while it keeps differing).")

    def __str__(self):
        return f"{self.node_id}: {self.reason} since {self.since:%Y-%m-%d %H:%M:%S}"


class ReconcileMark(models.Model):
    """Something the desired or observed state of some nodes depends on changed: the next reconcile tick evaluates
    them again. Written by database triggers (migration worker.0007) in the same transaction as the edit, whichever
    process or code path made it; read and deleted by the tick (worker/reconcile.py). A row names a node, or a pool
    (its nodes), or everything (a profile, QoS policy or cluster edit)."""

    id = models.BigAutoField(primary_key=True)
    node_id = models.BigIntegerField(null=True, blank=True)  # no foreign key: a deleted node's mark is harmless
    pool_id = models.BigIntegerField(null=True, blank=True)
    everything = models.BooleanField(default=False)

    def __str__(self):
        return "everything" if self.everything else f"node {self.node_id}" if self.node_id else f"pool {self.pool_id}"


class ReconcileState(models.Model):
    """Where the incremental reconcile tick stands (one row): the instant its last evaluation was for (schedule
    windows and pin ends crossed since are boundaries), the last full pass, the nodes left out of the loop then
    (stale or not ready: evaluated again once back), and what the full passes found the incremental ones missed."""

    evaluated_at = models.DateTimeField(null=True, blank=True)
    full_at = models.DateTimeField(null=True, blank=True, help_text="Empty: no full pass yet.")
    full_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A tick sent the full pass's task (worker.tasks.reconcile_full); it clears this.",
    )
    held = models.JSONField(default=list, help_text="Ids of live nodes out of the loop at the last evaluation.")
    missed = models.PositiveBigIntegerField(default=0, help_text="Nodes a full pass planned that no tick looked at.")
    last_missed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"evaluated {self.evaluated_at}, full pass {self.full_at}"


class LoopRun(models.Model):
    """The runs of one periodic loop (the reconcile tick): the last start, success and failure, and running totals of
    runs and seconds (a summary Prometheus can rate)."""

    name = models.CharField(max_length=50, unique=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_duration_seconds = models.FloatField(default=0.0)
    last_error = models.TextField(blank=True)
    runs = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    seconds = models.FloatField(default=0.0, help_text="Sum of the runs' durations.")

    def __str__(self):
        return self.name


class ClusterWatch(models.Model):
    """The node watch of one Kubernetes cluster as its watcher process last recorded it (`manage.py
    watch_clusters`): connected or not, a heartbeat every few seconds while it runs, the last full listing."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, primary_key=True, related_name="watch")
    connected = models.BooleanField(default=False)
    since = models.DateTimeField(help_text="When `connected` last changed.")
    heartbeat_at = models.DateTimeField(help_text="The watcher's last sign of life, connected or not.")
    listed_at = models.DateTimeField(null=True, blank=True, help_text="The last complete listing (a full sync).")
    error = models.TextField(blank=True)

    def __str__(self):
        return f"{self.cluster_id}: {'connected' if self.connected else 'disconnected'}"


class ClusterApiErrors(models.Model):
    """Failed calls to a cluster's API server by kind (throttled, conflict, server error...), counted since the row
    was made: retried calls count each failed attempt."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=20)
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "kind"], name="%(app_label)s_%(class)s_once")]

    def __str__(self):
        return f"{self.cluster_id} {self.kind}: {self.count}"


class ChangePhaseBucket(models.Model):
    """Time node changes spent in a phase, by the status they left it for: a cumulative histogram of one row per
    bucket (`le` of PHASE_BUCKETS by index; the last is +Inf and also holds the sum of seconds)."""

    phase = models.CharField(max_length=20, choices=ChangeStatus.choices)
    outcome = models.CharField(max_length=20, choices=ChangeStatus.choices)
    bucket = models.PositiveSmallIntegerField()
    count = models.PositiveBigIntegerField(default=0)
    seconds = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["phase", "outcome", "bucket"], name="%(app_label)s_%(class)s_once")
        ]

    def __str__(self):
        return f"{self.phase}→{self.outcome} [{self.bucket}]: {self.count}"


class KueueQuotaWrite(models.Model):
    """The nominalQuota Tessera last wrote for one flavor's resource in one ClusterQueue: a live value that differs
    was written by someone else (drift, reported and left alone until an admin takes the queue over)."""

    pool = models.ForeignKey("fleet.NodePool", on_delete=models.CASCADE, related_name="+")
    cluster_queue = models.CharField(max_length=253)
    flavor = models.CharField(max_length=253)
    resource = models.CharField(max_length=253)
    value = models.PositiveIntegerField()
    written_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "cluster_queue", "flavor", "resource"], name="%(app_label)s_%(class)s_unique"
            ),
        ]

    def __str__(self):
        return f"{self.cluster_queue}/{self.flavor}/{self.resource}={self.value}"
