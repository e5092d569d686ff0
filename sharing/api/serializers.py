"""Sharing objects as JSON; input is shaped here and judged by the services (one place for NVIDIA's rules)."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.fields import RefField, ref_to
from fleet.choices import GpuStack
from fleet.models import Node, NodePool
from sharing.mig import PRODUCTS, parse_layout
from sharing.models import NodePin, QoSComplianceReport, QoSPolicy, SharingProfile
from sharing.services import PROFILE_FIELDS


@extend_schema_field(
    {
        "oneOf": [
            {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
            {"type": "string", "example": "3g.40gb x2 + 1g.10gb x1"},
        ],
        "nullable": True,
    }
)
class LayoutField(serializers.Field):
    """A MIG layout as {"1g.10gb": 7}, the admin notation "1g.10gb x7", or null for MIG off."""

    def to_internal_value(self, data):
        if data is None:
            return None
        if isinstance(data, str):
            try:
                return parse_layout(data)
            except ValueError as exc:
                raise serializers.ValidationError(str(exc)) from exc
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in data.items()
        ):
            raise serializers.ValidationError('Give a layout as {"<profile>": <count>} or "<profile> x<count> + …".')
        return data

    def to_representation(self, value):
        return value


class SharingProfileSerializer(serializers.ModelSerializer):
    """A sharing profile; `mig_layouts` keys are "all" or GPU indices."""

    mig_layouts = serializers.DictField(child=LayoutField(allow_null=True), required=False)
    target_products = serializers.ListField(child=serializers.CharField(), allow_empty=False)

    class Meta:
        model = SharingProfile
        fields = [
            "id",
            "url",
            *PROFILE_FIELDS,  # what profile_create and profile_update take
            "imported",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {
            "url": {"view_name": "sharingprofile-detail"},
            "imported": {"read_only": True, "help_text": "the cluster configs it was imported from, kept by name"},
        }


class MigValidateSerializer(serializers.Serializer):
    """A layout to check on a product: `layout` as the UI writes it ("3g.40gb x2 + 1g.10gb") or as an object, or
    `devices` (the object form, kept for existing clients)."""

    product = serializers.CharField()
    layout = LayoutField(required=False, help_text='"3g.40gb x2 + 1g.10gb" (as the UI writes it) or {"3g.40gb": 2}')
    devices = serializers.DictField(child=serializers.IntegerField(min_value=0), required=False)

    def validate(self, attrs):
        given = [key for key in ("layout", "devices") if attrs.get(key) is not None]
        if len(given) != 1:
            raise serializers.ValidationError({"layout": ['Give the layout, e.g. "3g.40gb x2 + 1g.10gb".']})
        attrs["devices"] = attrs.pop(given[0])
        if any(not isinstance(n, int) or n < 0 for n in attrs["devices"].values()):
            raise serializers.ValidationError({given[0]: ["Counts are whole numbers, 0 or more."]})
        return attrs

    def validate_product(self, value):
        if value not in PRODUCTS:
            raise serializers.ValidationError(
                f"Unknown product {value!r}; known products: {', '.join(sorted(PRODUCTS))}"
            )
        return value


class PlacementSerializer(serializers.Serializer):
    profile = serializers.CharField()
    start = serializers.IntegerField()
    size = serializers.IntegerField()


class MigValidateResultSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    placements = PlacementSerializer(many=True, required=False)
    compute_slices_used = serializers.IntegerField(required=False)
    memory_slices_used = serializers.IntegerField(required=False)
    errors = serializers.ListField(child=serializers.CharField(), required=False)


class MigProfileSerializer(serializers.Serializer):
    name = serializers.CharField()
    profile_id = serializers.IntegerField()
    compute_slices = serializers.IntegerField()
    memory_slices = serializers.IntegerField()
    memory_mib = serializers.IntegerField()
    multiprocessors = serializers.IntegerField()
    max_count = serializers.IntegerField()
    starts = serializers.ListField(child=serializers.IntegerField())
    attribute = serializers.CharField(help_text='"", "+me", "+me.all", "+gfx" or "-me"')
    media_extensions = serializers.BooleanField()
    memory_estimated = serializers.BooleanField(help_text="memory_mib is Tessera's estimate, not a published figure")
    multiprocessors_estimated = serializers.BooleanField()
    resource_name = serializers.CharField()


class GpuProductSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="GFD's nvidia.com/gpu.product label")
    display_name = serializers.CharField(help_text="the NVML name")
    pci_device_ids = serializers.ListField(
        child=serializers.CharField(), help_text="the values mig-parted's device-filter matches, e.g. 0x20B010DE"
    )
    memory_mib = serializers.IntegerField()
    architecture = serializers.CharField()
    compute_capability = serializers.SerializerMethodField()
    mig_capable = serializers.BooleanField()
    compute_slices = serializers.IntegerField()
    memory_slices = serializers.IntegerField()
    profiles = MigProfileSerializer(many=True)
    figures_estimated = serializers.BooleanField()
    source = serializers.CharField(help_text="where the profile figures come from")
    power_limit_w = serializers.ListField(
        child=serializers.IntegerField(), help_text="[min, max] W a QoS power limit may set (contracts §4.3)"
    )
    power_limit_estimated = serializers.BooleanField()
    graphics_clock_mhz = serializers.ListField(
        child=serializers.IntegerField(), help_text="[min, max] MHz locked graphics clocks may use"
    )
    graphics_clock_estimated = serializers.BooleanField()

    def get_compute_capability(self, product) -> str:
        return "{}.{}".format(*product.compute_capability)


class PreviewRequestSerializer(serializers.Serializer):
    """Preview on a pool's nodes, or on chosen nodes."""

    pool = serializers.PrimaryKeyRelatedField(queryset=NodePool.objects.all(), required=False)
    nodes = serializers.PrimaryKeyRelatedField(queryset=Node.objects.all(), many=True, required=False)

    def validate(self, attrs):
        if bool(attrs.get("pool")) == bool(attrs.get("nodes")):
            raise serializers.ValidationError({"pool": ["Give either a pool or a list of nodes."]})
        return attrs


class PodRefSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    name = serializers.CharField()
    gpu_resources = serializers.DictField(child=serializers.IntegerField())


class NodeImpactSerializer(serializers.Serializer):
    node = serializers.SerializerMethodField()
    errors = serializers.ListField(child=serializers.CharField())
    allocatable_before = serializers.DictField(child=serializers.IntegerField())
    allocatable_after = serializers.DictField(child=serializers.IntegerField())
    disruption = serializers.CharField()
    reset_gpus = serializers.ListField(child=serializers.IntegerField())
    pods_losing = PodRefSerializer(many=True)
    mig_config = serializers.SerializerMethodField()
    device_plugin_config = serializers.SerializerMethodField()
    gpu_stack = serializers.ChoiceField(
        source="node.gpu_stack", choices=GpuStack.choices, help_text="What serves the node's GPUs (Node.gpu_stack)."
    )
    assumption = serializers.CharField(
        help_text="What this preview assumed that the node does not have (a DRA node read as a device-plugin one); "
        "empty when nothing."
    )

    def get_node(self, impact) -> dict:
        return ref_to(impact.node, "node-detail", self.context.get("request"))

    def get_mig_config(self, impact) -> str | None:
        return impact.config.mig_config_name if impact.config else None

    def get_device_plugin_config(self, impact) -> str | None:
        return impact.config.device_plugin_key if impact.config else None


class PreviewSummarySerializer(serializers.Serializer):
    nodes = serializers.IntegerField()
    changing = serializers.IntegerField()
    refused = serializers.IntegerField()
    resetting = serializers.IntegerField(help_text="Nodes whose GPUs switch MIG mode.")
    gpus_resetting = serializers.IntegerField(help_text="GPUs reset to switch MIG mode, over those nodes.")
    pods_losing = serializers.IntegerField()


class PreviewSerializer(serializers.Serializer):
    summary = PreviewSummarySerializer()
    nodes = NodeImpactSerializer(many=True)


class PinRequestSerializer(serializers.Serializer):
    nodes = serializers.PrimaryKeyRelatedField(queryset=Node.objects.all(), many=True, allow_empty=False)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=300)
    until = serializers.DateTimeField(required=False, help_text="the pins end at this instant; omitted: until unpinned")


class NodePinSerializer(serializers.ModelSerializer):
    node = RefField("node-detail", read_only=True)
    profile = RefField("sharingprofile-detail", read_only=True)

    class Meta:
        model = NodePin
        fields = ["id", "node", "profile", "reason", "until", "created_at"]


class QoSPolicySerializer(serializers.ModelSerializer):
    """A QoS policy: workload rules, GPU settings and host tuning (applied by agents), kubelet expectations."""

    class Meta:
        model = QoSPolicy
        fields = [
            "id",
            "url",
            "name",
            "description",
            "required_qos",
            "required_priority_class",
            "max_pods_per_gpu",
            "exclusive_taint",
            "requires_memory_isolation",
            "enforce_admission",
            "persistence_mode",
            "compute_mode",
            "time_slice_interval",
            "mps_active_thread_percentage",
            "mps_pinned_memory_limit_mib",
            "gpu_clock_min_mhz",
            "gpu_clock_max_mhz",
            "power_limit_w",
            "transparent_hugepages",
            "swappiness",
            "cpu_governor",
            "dirty_ratio",
            "dirty_background_ratio",
            "topology_manager_policy",
            "cpu_manager_policy",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {"url": {"view_name": "qospolicy-detail"}}


class QoSAttachSerializer(serializers.Serializer):
    pool = serializers.PrimaryKeyRelatedField(queryset=NodePool.objects.all())


class QoSComplianceSerializer(serializers.ModelSerializer):
    pool = RefField("nodepool-detail", read_only=True)
    policy = RefField("qospolicy-detail", read_only=True)
    violations = serializers.ListField(child=serializers.DictField())
    kubelet_mismatches = serializers.ListField(child=serializers.DictField())

    class Meta:
        model = QoSComplianceReport
        fields = ["pool", "policy", "checked_at", "pods_checked", "violation_count", "violations", "kubelet_mismatches"]
