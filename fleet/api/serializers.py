"""Fleet objects as JSON, and input checked before it reaches the services (serializers never save)."""

import typing
from collections import defaultdict
from functools import cached_property

from django.db import models
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from agent import protocol
from core.api.fields import RefField, db_max_value, ref
from fleet.api.protocol import protocol_serializer
from fleet.health import health_words
from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool
from fleet.querysets import is_stale
from fleet.services import NODE_FIELDS

# The GPU's own columns in its output; listed once for GpuSerializer and the row-based GPU list.
GPU_COLUMNS = (
    "index",
    "uuid",
    "product",
    "memory_mib",
    "pci_bus_id",
    "pci_device_id",
    "numa_node",
    "dra_device",
    "mig_capable",
    "mig_enabled",
    "mig_pending",
    "health",
    "settings",
    "ecc_dbe_total",
    "ecc_sbe_total",
    "last_xid",
    "last_xid_at",
    "row_remap_failure",
    "row_remap_pending",
    "uncorrectable_remapped_rows",
    "correctable_remapped_rows",
    "health_signals",
    "utilization_pct",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "metrics_at",
    "gone_at",
)
GPU_MIG_DEVICE_COLUMNS = (
    "id",
    "profile",
    "start",
    "size",
    "uuid",
    "dra_device",
    "in_use_by",
    "utilization_pct",
    "memory_used_mib",
)
_HEALTH_DETAIL_HELP = (
    "Why the GPU is in its health state and what to do (e.g. 'XID 79: fallen off the bus: …'); empty when healthy."
)


class ClusterSerializer(serializers.ModelSerializer):
    """A cluster with its connection health and sizes; the kubeconfig path is accepted but never shown. The MIG
    strategy and device-plugin version are read from the GPU Operator's ClusterPolicy, never written here."""

    node_count = serializers.IntegerField(read_only=True)
    pool_count = serializers.IntegerField(read_only=True)
    mps_honours_fail_false = serializers.BooleanField(read_only=True, allow_null=True)

    class Meta:
        model = Cluster
        fields = [
            "id",
            "url",
            "name",
            "description",
            "driver",
            "kubeconfig_path",
            "in_cluster",
            "operator_namespace",
            "metrics_url",
            "prometheus_url",
            "connection_state",
            "last_contact_at",
            "last_error",
            "last_error_at",
            "mig_strategy",
            "device_plugin_version",
            "mps_honours_fail_false",
            "cluster_policy_read_at",
            "node_count",
            "pool_count",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "connection_state",
            "last_contact_at",
            "last_error",
            "last_error_at",
            "mig_strategy",
            "device_plugin_version",
            "cluster_policy_read_at",
        ]
        extra_kwargs = {"kubeconfig_path": {"write_only": True}}


class NodePoolSerializer(serializers.ModelSerializer):
    """A pool and its live member count; its cluster is chosen at creation and fixed after."""

    cluster = RefField("cluster-detail", queryset=Cluster.objects.all())
    node_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = NodePool
        fields = [
            "id",
            "url",
            "cluster",
            "name",
            "description",
            "node_selector",
            "node_count",
            "created_at",
            "updated_at",
        ]

    def validate_cluster(self, cluster):
        """Checked, not ignored, on PUT and PATCH: the schema says an id, and a different one is not a move."""
        if self.instance is not None and cluster != self.instance.cluster:
            raise serializers.ValidationError(
                "A pool's cluster is chosen when it is created; create a pool in the other cluster instead."
            )
        return cluster


class PoolMembersSetSerializer(serializers.Serializer):
    """The complete new member list of a pool, as node ids (live nodes of the pool's cluster)."""

    nodes = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=db_max_value(Node, "id")), max_length=10_000
    )

    def validate_nodes(self, ids):
        nodes = list(Node.objects.live().filter(pk__in=set(ids)))
        unknown = sorted(set(ids) - {n.pk for n in nodes})
        if unknown:
            raise serializers.ValidationError(f"No live node with id {', '.join(map(str, unknown[:10]))}.")
        return nodes


class PoolMembersSerializer(serializers.Serializer):
    """A pool's live members as links."""

    nodes = RefField("node-detail", many=True, read_only=True)


class GpuSettingsSerializer(serializers.Serializer):
    """A GPU's settings as its agent last read them (Gpu.settings); null where unreadable or not sent by an older
    agent. Locked clocks are not among them: NVML cannot read them back (see the node's agent_node_settings)."""

    # Text, not an enum: the agent's report already names this set of values, and one set gets one component name.
    compute_mode = serializers.CharField(
        allow_null=True, help_text=f"One of {', '.join(typing.get_args(protocol.ComputeMode))}."
    )
    persistence_mode = serializers.BooleanField(allow_null=True)
    power_limit_w = serializers.FloatField(allow_null=True, help_text="The enforced power limit (W).")
    applications_clock_mhz = serializers.IntegerField(allow_null=True)
    max_graphics_clock_mhz = serializers.IntegerField(allow_null=True)


class NodeSerializer(serializers.ModelSerializer):
    """A node as last observed, with a summary of its live GPUs and whether its observations are stale."""

    cluster = RefField("cluster-detail", read_only=True)
    pool = RefField("nodepool-detail", read_only=True, allow_null=True)
    host_settings = protocol_serializer(protocol.HostSettings)(
        read_only=True, allow_null=True, help_text="Host tuning as the agent last read it; null until it reports."
    )
    agent_node_settings = serializers.SerializerMethodField(
        help_text="The QoS GPU settings and host tuning the agent last applied, as desired (only those set, like "
        "the desired config's node_settings); null: none reported."
    )
    gpu_count = serializers.IntegerField(read_only=True)
    unhealthy_gpu_count = serializers.IntegerField(read_only=True)
    mean_utilization = serializers.FloatField(read_only=True, allow_null=True)
    product = serializers.CharField(read_only=True, allow_null=True)
    stale = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "url",
            "name",
            "cluster",
            "pool",
            *NODE_FIELDS,  # what the node reports, written by ingest
            "gpu_stack",
            "dynamic_mig",
            "config_state_since",
            "last_seen_at",
            "agent_last_seen_at",
            "agent_version",
            "agent_node_settings",
            "host_settings",
            "gone_at",
            "stale",
            "gpu_count",
            "unhealthy_gpu_count",
            "mean_utilization",
            "product",
            "created_at",
            "updated_at",
        ]

    @cached_property
    def _now(self):
        return timezone.now()  # one instant for the whole page

    def get_stale(self, node) -> bool:
        return is_stale(node, self._now)  # the same rule as Node.objects.stale()

    @extend_schema_field(protocol_serializer(protocol.NodeSettings)(allow_null=True))
    def get_agent_node_settings(self, node) -> dict | None:
        return node.agent_node_settings  # as stored: sparse, which a serializer would fill with nulls


class GpuMigDeviceSerializer(serializers.ModelSerializer):
    """A MIG device as listed inside its GPU."""

    class Meta:
        model = MigDevice
        fields = GPU_MIG_DEVICE_COLUMNS


class GpuSerializer(serializers.ModelSerializer):
    """A GPU with links to its node, cluster and pool, its latest metrics and its MIG devices."""

    node = RefField("node-detail", read_only=True)
    cluster = RefField("cluster-detail", source="node.cluster", read_only=True)
    pool = RefField("nodepool-detail", source="node.pool", read_only=True, allow_null=True)
    settings = GpuSettingsSerializer(read_only=True, allow_null=True)
    health_detail = serializers.CharField(source="health_words", read_only=True, help_text=_HEALTH_DETAIL_HELP)
    mig_devices = GpuMigDeviceSerializer(many=True, read_only=True)

    class Meta:
        model = Gpu
        fields = ["id", "url", "node", "cluster", "pool", *GPU_COLUMNS, "health_detail", "mig_devices"]


class MigDeviceSerializer(serializers.ModelSerializer):
    """A MIG device with links to its GPU and node."""

    gpu = RefField("gpu-detail", read_only=True)
    node = RefField("node-detail", source="gpu.node", read_only=True)

    class Meta:
        model = MigDevice
        fields = [
            "id",
            "url",
            "gpu",
            "node",
            "profile",
            "start",
            "size",
            "uuid",
            "dra_device",
            "gpu_instance_id",
            "compute_instance_id",
            "memory_mib",
            "in_use_by",
            "utilization_pct",
            "memory_used_mib",
        ]


# --- the GPU list, built from rows ------------------------------------------------------------------------------
# DRF's per-field path over model instances costs several times the raw query for a page of 500 GPUs (bench B1),
# so the list reads plain rows and builds GpuSerializer's exact shape here; a test holds the two equal.

_HEALTH_INPUTS = ("last_xid", "ecc_dbe_total", "row_remap_failure", "row_remap_pending")
_DATETIME_COLUMNS = tuple(c for c in GPU_COLUMNS if isinstance(Gpu._meta.get_field(c), models.DateTimeField))
_LINKS = ("id", "node_id", "node__name", "node__cluster_id", "node__cluster__name", "node__pool_id", "node__pool__name")


def _detail_url_prefix(view_name, request) -> str:
    """The detail URL without the id, reversed once per page instead of once per link."""
    return reverse(view_name, kwargs={"pk": 0}, request=request).removesuffix("0/")


def gpu_list_items(ids, *, request) -> list[dict]:
    """GpuSerializer's output for a page of GPU ids, in their order: one query for the rows, one for MIG devices."""
    mig_devices = defaultdict(list)
    page_devices = MigDevice.objects.filter(gpu_id__in=ids).order_by("gpu_id", "start")
    for device in page_devices.values("gpu_id", *GPU_MIG_DEVICE_COLUMNS):
        mig_devices[device.pop("gpu_id")].append(device)
    # The zone looked up once per page, not per value (DRF's default asks the request-local zone every time).
    as_datetime = serializers.DateTimeField(default_timezone=timezone.get_current_timezone()).to_representation
    gpu_url, node_url, cluster_url, pool_url = (
        _detail_url_prefix(name, request) for name in ("gpu-detail", "node-detail", "cluster-detail", "nodepool-detail")
    )
    items = {}
    rows = Gpu.objects.filter(pk__in=ids).order_by().values_list(*_LINKS, *GPU_COLUMNS)
    for gpu_id, node_id, node_name, cluster_id, cluster_name, pool_id, pool_name, *values in rows:
        item = items[gpu_id] = {
            "id": gpu_id,
            "url": f"{gpu_url}{gpu_id}/",
            "node": ref(node_id, node_name, f"{node_url}{node_id}/"),
            "cluster": ref(cluster_id, cluster_name, f"{cluster_url}{cluster_id}/"),
            "pool": None if pool_id is None else ref(pool_id, pool_name, f"{pool_url}{pool_id}/"),
        }
        item.update(zip(GPU_COLUMNS, values, strict=True))
        for column in _DATETIME_COLUMNS:
            if item[column] is not None:
                item[column] = as_datetime(item[column])
        item["health_detail"] = health_words(**{f: item[f] for f in _HEALTH_INPUTS})
        item["mig_devices"] = mig_devices[gpu_id]
    return [items[gpu_id] for gpu_id in ids]
