"""Fleet inventory: what exists and what it reported. Desired state lives in sharing/ and scheduling/."""

from django.conf import settings
from django.core.validators import URLValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse

from core.fields import NameField
from fleet.choices import (
    UNHEALTHY_STATES,
    ClusterDriver,
    ClusterMigStrategy,
    ConfigState,
    ConnectionState,
    GpuHealth,
    GpuStack,
    SharingMode,
)
from fleet.health import health_words, missing_signals
from fleet.querysets import (
    ClusterQuerySet,
    GpuQuerySet,
    MigDeviceQuerySet,
    NodePoolQuerySet,
    NodeQuerySet,
    PendingAgentQuerySet,
    pending_agent_ttl,
)
from sharing.spec import catalog_product, mps_honours_fail_false

HTTP_URL = URLValidator(schemes=["http", "https"], message="Enter an http:// or https:// URL.")


class Cluster(models.Model):
    """A set of nodes reached through one driver: a Kubernetes API (GPU Operator) or Tessera's node agents."""

    name = NameField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    driver = models.CharField(max_length=20, choices=ClusterDriver.choices, default=ClusterDriver.KUBERNETES)
    # A kubeconfig in TESSERA["KUBECONFIG_DIR"] (a path inside it or relative to it, fleet/cluster_access.py);
    # never returned by the API or written to logs.
    kubeconfig_path = models.CharField(max_length=500, blank=True)
    in_cluster = models.BooleanField(default=False, help_text="Use the service account of the pod Tessera runs in.")
    operator_namespace = models.CharField(max_length=63, default="gpu-operator")
    metrics_url = models.URLField(
        blank=True,
        validators=[HTTP_URL],
        help_text="One dcgm-exporter endpoint for the whole cluster. Empty: each node's exporter pod is scraped "
        "through the API server's pod proxy.",
    )
    prometheus_url = models.URLField(
        blank=True,
        validators=[HTTP_URL],
        help_text="A Prometheus server that scrapes this cluster's dcgm-exporter (e.g. http://prometheus.monitoring"
        ":9090): the DCGM series are read with instant queries instead of scraping the exporters.",
    )
    connection_state = models.CharField(max_length=10, choices=ConnectionState.choices, default=ConnectionState.NEVER)
    last_contact_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    # Read from the GPU Operator's ClusterPolicy by the health check (Kubernetes clusters only): the strategy the
    # device plugin runs under whatever Tessera renders, and the plugin's image tag (what MPS honours depends on it).
    mig_strategy = models.CharField(max_length=10, choices=ClusterMigStrategy.choices, blank=True)
    device_plugin_version = models.CharField(max_length=100, blank=True)
    cluster_policy_read_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ClusterQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(driver=ClusterDriver.KUBERNETES) | ~Q(kubeconfig_path="") | Q(in_cluster=True),
                name="%(app_label)s_%(class)s_kubernetes_has_credentials",
                violation_error_message="A Kubernetes cluster needs a kubeconfig path or in-cluster credentials.",
            ),
        ]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("fleet:cluster_detail", args=[self.pk])

    @property
    def mps_honours_fail_false(self) -> bool | None:
        """Whether this cluster's device plugin lets an MPS client ask for more than one replica when a profile
        allows it (v0.20.0+, contracts §3.3); None while its version is unknown."""
        return mps_honours_fail_false(self.device_plugin_version)


class NodePool(models.Model):
    """Nodes that share a sharing profile, schedule and QoS policy; members by label selector or explicitly."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools")
    name = NameField(max_length=100)
    description = models.TextField(blank=True)
    node_selector = models.CharField(
        max_length=500,
        blank=True,
        help_text="Kubernetes label selector (e.g. tessera.io/pool=inference). Empty: members are set explicitly.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = NodePoolQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="%(app_label)s_%(class)s_unique_name_per_cluster"),
        ]

    def __str__(self):
        return f"{self.cluster.name}/{self.name}"

    def get_absolute_url(self):
        return reverse("console:pool_detail", args=[self.pk])


class Node(models.Model):
    """A GPU node and what it last reported: readiness, versions, and its sharing config and state."""

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="nodes")
    pool = models.ForeignKey(NodePool, on_delete=models.SET_NULL, null=True, blank=True, related_name="nodes")
    name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict, blank=True)
    ready = models.BooleanField(null=True)
    unschedulable = models.BooleanField(default=False)
    allocatable = models.JSONField(default=dict, blank=True, help_text="Observed allocatable GPU resources.")
    kubelet_version = models.CharField(max_length=50, blank=True)
    driver_version = models.CharField(max_length=50, blank=True)
    cuda_version = models.CharField(max_length=20, blank=True)
    numa_nodes = models.PositiveSmallIntegerField(null=True, blank=True)
    kubelet_config = models.JSONField(
        default=dict, blank=True, help_text="The kubelet's topology and CPU manager policies, from its configz."
    )
    observed_mode = models.CharField(max_length=20, choices=SharingMode.choices, blank=True)
    gpu_stack = models.CharField(
        max_length=20,
        choices=GpuStack.choices,
        blank=True,
        help_text="What serves the node's GPUs: the device plugin or NVIDIA's DRA driver (under a ClusterPolicy or a "
        "GPUCluster); empty until a full sync read it.",
    )
    dynamic_mig = models.BooleanField(
        null=True, blank=True, help_text="The DRA driver's DynamicMIG is on; null: not a DRA node, or not known."
    )
    observed_mig_config = models.CharField(max_length=253, blank=True)
    observed_device_plugin_config = models.CharField(max_length=253, blank=True)
    config_state = models.CharField(max_length=20, choices=ConfigState.choices, default=ConfigState.UNKNOWN)
    config_state_since = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True, db_index=True)
    agent_last_seen_at = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    agent_config_id = models.CharField(
        max_length=100, blank=True, help_text="The desired config the agent last reported as applied."
    )
    agent_node_settings = models.JSONField(
        null=True,
        blank=True,
        help_text="The QoS node settings the agent last applied, as desired ({gpu, host}); null: none reported.",
    )
    host_settings = models.JSONField(
        null=True,
        blank=True,
        help_text="Host tuning as the agent read it: {thp, swappiness, cpu_governor, dirty_ratio, "
        "dirty_background_ratio}, null where unreadable; null until an agent reports.",
    )
    # Unchanged inventory (the usual report) skips the inventory write: only metrics and last-seen are stored.
    agent_report_hash = models.CharField(max_length=64, blank=True, editable=False)
    agent_reports_dropped = models.PositiveIntegerField(
        default=0, editable=False, help_text="Buffered reports of this node the database would not take (a bug)."
    )
    gone_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="%(app_label)s_%(class)s_unique_name_per_cluster"),
        ]
        indexes = [
            models.Index(fields=["cluster", "pool"]),
            models.Index(fields=["config_state"]),
            # GPU lists are ordered by node name: with this index a page reads its rows in order instead of sorting all.
            models.Index(fields=["name"]),
            # What a GPU aggregate needs of its node (the overview's charts): SQLite joins 80,000 GPUs to their
            # nodes through this small index instead of reading a wide node row per GPU (B5: twice as fast).
            models.Index(fields=["id", "gone_at", "cluster", "observed_mode"]),
        ]

    def __str__(self):
        return self.name

    def get_absolute_url(self):
        return reverse("console:node_detail", args=[self.pk])


class Gpu(models.Model):
    """One physical GPU; kept (marked gone) when it disappears, so its history survives a replacement."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    product = models.CharField(max_length=100, db_index=True, help_text="GPU Feature Discovery product name.")
    memory_mib = models.PositiveIntegerField(default=0)
    pci_bus_id = models.CharField(max_length=32, blank=True)
    pci_device_id = models.CharField(max_length=16, blank=True)
    numa_node = models.SmallIntegerField(null=True, blank=True)
    dra_device = models.CharField(
        max_length=300,
        blank=True,
        help_text="driver/pool/device of the GPU in its node's ResourceSlices (DRA nodes, whole GPUs); else empty.",
    )
    mig_capable = models.BooleanField(default=False)
    mig_enabled = models.BooleanField(default=False)
    mig_pending = models.BooleanField(null=True, blank=True, help_text="MIG mode after the next reset, if different.")
    health = models.CharField(max_length=10, choices=GpuHealth.choices, default=GpuHealth.UNKNOWN)
    settings = models.JSONField(
        null=True,
        blank=True,
        help_text="Settings as the agent read them: {compute_mode, persistence_mode, power_limit_w, "
        "applications_clock_mhz, max_graphics_clock_mhz}, null where unreadable; null until an agent reports.",
    )
    ecc_dbe_total = models.PositiveIntegerField(default=0)
    ecc_sbe_total = models.PositiveIntegerField(default=0)
    last_xid = models.PositiveIntegerField(null=True, blank=True)
    last_xid_at = models.DateTimeField(null=True, blank=True)
    # Row remapping (Ampere and later, not while MIG is on); null: not exported (contracts §10).
    row_remap_failure = models.BooleanField(null=True, blank=True)
    row_remap_pending = models.BooleanField(null=True, blank=True)
    uncorrectable_remapped_rows = models.PositiveIntegerField(null=True, blank=True)
    correctable_remapped_rows = models.PositiveIntegerField(null=True, blank=True)
    health_signals = models.JSONField(
        null=True,
        blank=True,
        help_text="The dcgm-exporter health counters the last scrape carried for this GPU; null: not scraped.",
    )
    utilization_pct = models.FloatField(null=True, blank=True)
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    metrics_at = models.DateTimeField(null=True, blank=True)
    processes = models.JSONField(
        default=list,
        blank=True,
        help_text="Compute processes the agent saw: [{pid, used_memory_mib, gpu_instance_id, compute_instance_id}].",
    )
    gone_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = GpuQuerySet.as_manager()

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=Q(gone_at__isnull=True),
                name="%(app_label)s_%(class)s_unique_live_index_per_node",
            ),
            models.CheckConstraint(
                condition=Q(utilization_pct__isnull=True) | Q(utilization_pct__gte=0, utilization_pct__lte=100),
                name="%(app_label)s_%(class)s_utilization_is_percent",
            ),
        ]
        indexes = [
            models.Index(fields=["gone_at"]),  # counts of live GPUs (every list page) read only this index
            # The few live GPUs in need of attention, by node: the overview's and pool pages' count of nodes with
            # one read these instead of every GPU row (bench B5). Health rarely changes, so reports still update
            # GPU rows in place (HOT, migration 0013).
            models.Index(
                fields=["node"],
                condition=Q(gone_at__isnull=True, health__in=UNHEALTHY_STATES),
                name="fleet_gpu_unhealthy_live_idx",
            ),
        ]

    def __str__(self):
        return f"{self.node.name}/gpu{self.index}"

    def get_absolute_url(self):
        return reverse("console:gpu_detail", args=[self.pk])

    @property
    def memory_used_pct(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_mib:
            return None
        return round(100 * self.memory_used_mib / self.memory_mib, 1)

    @property
    def in_mig_catalog(self) -> bool:
        """Whether Tessera's MIG catalog knows this model; one it does not is still shared whole (passthrough,
        time-slicing, MPS), never split."""
        return catalog_product(self.product) is not None

    @property
    def health_words(self) -> str:
        """Why the GPU is in its health state and what to do (fleet.health)."""
        return health_words(
            last_xid=self.last_xid,
            ecc_dbe_total=self.ecc_dbe_total,
            row_remap_failure=self.row_remap_failure,
            row_remap_pending=self.row_remap_pending,
        )

    @property
    def missing_health_signals(self) -> list[dict]:
        """Health counters dcgm-exporter does not export for this GPU, with the CSV lines that would enable them."""
        return missing_signals(self.health_signals, mig_enabled=self.mig_enabled)


class MigDevice(models.Model):
    """A MIG slice as observed on a GPU: profile, placement in memory slices, and who uses it."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="mig_devices")
    profile = models.CharField(max_length=32)
    start = models.PositiveSmallIntegerField()
    size = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, blank=True)
    dra_device = models.CharField(
        max_length=300, blank=True, help_text="driver/pool/device in the node's ResourceSlices (DRA nodes); else empty."
    )
    gpu_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    compute_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    memory_mib = models.PositiveIntegerField(default=0)
    in_use_by = models.CharField(max_length=300, blank=True, help_text="Pod (namespace/name) or process using it.")
    utilization_pct = models.FloatField(
        null=True, blank=True, help_text="Graphics engine activity of the slice (DCGM_FI_PROF_GR_ENGINE_ACTIVE), in %."
    )
    memory_used_mib = models.PositiveIntegerField(null=True, blank=True)

    objects = MigDeviceQuerySet.as_manager()

    class Meta:
        ordering = ["gpu", "start"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "start"], name="%(app_label)s_%(class)s_unique_start_per_gpu"),
            models.UniqueConstraint(fields=["uuid"], condition=~Q(uuid=""), name="%(app_label)s_%(class)s_unique_uuid"),
            models.CheckConstraint(condition=Q(size__gte=1, size__lte=8), name="%(app_label)s_%(class)s_size_in_range"),
            models.CheckConstraint(
                condition=Q(utilization_pct__isnull=True) | Q(utilization_pct__gte=0, utilization_pct__lte=100),
                name="%(app_label)s_%(class)s_utilization_is_percent",
            ),
        ]

    def __str__(self):
        return f"{self.gpu}/{self.profile}@{self.start}"

    @property
    def memory_used_pct(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_mib:
            return None
        return round(100 * self.memory_used_mib / self.memory_mib, 1)


class Pod(models.Model):
    """A workload pod holding GPU resources on a node, as last observed; drives busy checks, drains and impact."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="pods")
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64)
    phase = models.CharField(max_length=20, blank=True)
    qos_class = models.CharField(max_length=20, blank=True)
    priority_class = models.CharField(max_length=253, blank=True)
    owner_kind = models.CharField(max_length=63, blank=True)
    owner_name = models.CharField(max_length=253, blank=True)
    gpu_resources = models.JSONField(
        default=dict, blank=True, help_text="GPU resources it holds, e.g. {'nvidia.com/gpu': 1}."
    )
    spec = models.JSONField(
        default=dict, blank=True, help_text="Container requests/limits, tolerations: for QoS rules."
    )
    labels = models.JSONField(default=dict, blank=True, help_text="The pod's labels (GPU-hours per team).")
    created_at = models.DateTimeField(null=True, blank=True, help_text="The pod's creationTimestamp.")
    scheduled_at = models.DateTimeField(
        null=True, blank=True, help_text="When a node took it (PodScheduled); minus created_at, how long it waited."
    )
    observed_at = models.DateTimeField()

    class Meta:
        ordering = ["namespace", "name"]
        constraints = [models.UniqueConstraint(fields=["uid"], name="%(app_label)s_%(class)s_unique_uid")]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class PendingPod(models.Model):
    """A pod asking for GPU resources that no node took yet, as last listed: the demand that waits. Replaced as a
    whole per cluster by each pod sync; capacity/ samples it per pool."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pending_pods")
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64)
    labels = models.JSONField(default=dict, blank=True)
    gpu_resources = models.JSONField(default=dict, help_text="GPU resources it asks for, e.g. {'nvidia.com/gpu': 1}.")
    node_selector = models.JSONField(default=dict, blank=True, help_text="spec.nodeSelector: which pool it waits for.")
    created_at = models.DateTimeField(help_text="The pod's creationTimestamp: it has waited since.")
    observed_at = models.DateTimeField()

    class Meta:
        ordering = ["namespace", "name"]
        constraints = [models.UniqueConstraint(fields=["uid"], name="%(app_label)s_%(class)s_unique_uid")]

    def __str__(self):
        return f"{self.namespace}/{self.name}"


class AgentJoinToken(models.Model):
    """A secret that node agents of one cluster trade for their own credentials; only its SHA-256 is stored.

    It registers new nodes (until it expires, is revoked or reaches max_uses; only names matching its pattern). An
    existing node is registered again only with its current credential, an admin's approval (PendingAgent), or a
    service-account token the cluster vouches for (`service_account`): the token alone never takes over a node.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="agent_join_tokens")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    key_id = models.CharField(max_length=16, unique=True, editable=False, help_text="Public part of the token.")
    secret_hash = models.CharField(max_length=64, editable=False)
    expires_at = models.DateTimeField()
    max_uses = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: any number until it expires.")
    uses = models.PositiveIntegerField(default=0)
    node_name_pattern = models.CharField(
        max_length=253,
        blank=True,
        help_text="Shell-style pattern (fnmatch, e.g. rack-b12-*) the node names it registers must match; empty: any.",
    )
    service_account = models.CharField(
        max_length=317,
        blank=True,
        help_text="namespace:name of a Kubernetes service account: agents must also present its token, reviewed by "
        "the cluster's API server (TokenReview), and register as the node their pod runs on; empty: no review.",
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_uses__isnull=True) | Q(uses__lte=models.F("max_uses")),
                name="%(app_label)s_%(class)s_uses_within_max",
            ),
            models.CheckConstraint(condition=~Q(max_uses=0), name="%(app_label)s_%(class)s_max_uses_positive"),
        ]

    def __str__(self):
        return f"{self.cluster.name}/{self.name}"


class AgentCredential(models.Model):
    """A node agent's bearer credential: reads and reports for its own node only; one active per node."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agent_credentials")
    join_token = models.ForeignKey(
        AgentJoinToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="credentials"
    )
    key_id = models.CharField(max_length=16, unique=True, editable=False, help_text="Public part of the credential.")
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["node"],
                condition=Q(revoked_at__isnull=True),
                name="%(app_label)s_%(class)s_one_active_per_node",
            ),
        ]

    def __str__(self):
        return f"{self.node.name} ({self.key_id})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class GpuEvent(models.Model):
    """An XID error or a rise of uncorrectable ECC errors on a GPU, as its agent reported it. Append-only."""

    class Kind(models.TextChoices):
        XID = "xid", "XID error"
        ECC = "ecc", "Uncorrectable ECC errors"

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=3, choices=Kind.choices)
    code = models.PositiveIntegerField(help_text="The XID, or the uncorrectable ECC error total after the rise.")
    gpu_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    compute_instance_id = models.PositiveSmallIntegerField(null=True, blank=True)
    message = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        constraints = [
            # An agent re-sends XID events whose report got no answer; the same event is stored once.
            models.UniqueConstraint(fields=["gpu", "kind", "code", "at"], name="%(app_label)s_%(class)s_once"),
        ]
        indexes = [models.Index(fields=["gpu", "-at"])]

    def __str__(self):
        return f"{self.gpu} {self.kind} {self.code} at {self.at:%Y-%m-%d %H:%M:%S}"


class UuidConflict(models.Model):
    """A GPU or MIG device UUID an agent reported while another live node holds it: the report was refused (409),
    since a node speaks only for its own GPUs. Open (shown on both nodes' pages) until a report of `node` is
    accepted again: it no longer names the UUID, or the holder no longer holds it (it stopped reporting it, or is
    gone)."""

    class Kind(models.TextChoices):
        GPU = "gpu", "GPU"
        MIG = "mig", "MIG device"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="uuid_claims", help_text="The reporter.")
    holder = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="uuid_claims_held")
    uuid = models.CharField(max_length=64)
    kind = models.CharField(max_length=3, choices=Kind.choices)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    reports = models.PositiveIntegerField(default=1, help_text="Reports refused for it so far.")
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-first_seen_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "uuid"],
                condition=Q(resolved_at__isnull=True),
                name="%(app_label)s_%(class)s_one_open_per_node_and_uuid",
            ),
        ]
        indexes = [models.Index(fields=["holder", "resolved_at"])]

    def __str__(self):
        return f"{self.node.name} claims {self.kind} {self.uuid} of {self.holder.name}"


class PendingAgent(models.Model):
    """An agent asking to register a node that exists already, without its current credential (its state was lost,
    or it impersonates the node): it waits for an admin. Bound to a random key the agent keeps, so only the agent
    that asked collects the credential once approved; its fingerprint is in the agent's log and on the admin page."""

    class Status(models.TextChoices):
        PENDING = "pending", "Waiting for an admin"
        APPROVED = "approved", "Approved: the agent collects its credential at its next call"
        REJECTED = "rejected", "Rejected"
        COMPLETED = "completed", "Registered"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="pending_agents")
    join_token = models.ForeignKey(
        AgentJoinToken, on_delete=models.SET_NULL, null=True, blank=True, related_name="pending_agents"
    )
    key_hash = models.CharField(max_length=64, editable=False, help_text="SHA-256 of the agent's request key.")
    agent_version = models.CharField(max_length=50, blank=True)
    address = models.CharField(max_length=45, blank=True, help_text="The client address it asked from.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    requested_at = models.DateTimeField()
    last_asked_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)

    objects = PendingAgentQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["node", "key_hash"], name="%(app_label)s_%(class)s_one_per_node_and_key"),
        ]
        indexes = [models.Index(fields=["status", "-requested_at"])]

    def __str__(self):
        return f"{self.node.name} ({self.fingerprint})"

    @property
    def expires_at(self):
        """Until when an admin may approve it (only a request still waiting expires)."""
        return self.requested_at + pending_agent_ttl()

    @property
    def fingerprint(self) -> str:
        """What the agent logs (agent.protocol.request_fingerprint): the admin matches the two before approving."""
        return self.key_hash[:16]
