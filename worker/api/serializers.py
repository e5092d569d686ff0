"""Rollouts and node changes as JSON, with progress; input for starting one."""

from functools import partial

from django.utils import timezone
from rest_framework import serializers

from core.api.fields import RefField
from fleet.models import Node, NodePool
from scheduling.api.serializers import AssignRequestSerializer
from scheduling.kueue import MAX_LEAD_MINUTES
from scheduling.models import KueueBinding
from sharing.strategy import STRATEGY_FIELDS, StrategyField, strategy_default
from worker.models import AdmissionPolicyState, KueueQuotaWrite, NodeChange, NodeRetry, Rollout
from worker.selectors import rollout_progress


class NodeChangeSerializer(serializers.ModelSerializer):
    node = RefField("node-detail", read_only=True)
    profile = serializers.CharField(source="to_config.profile", default=None, read_only=True)
    mig_config = serializers.CharField(source="to_config.mig_config", default=None, read_only=True)
    device_plugin_config = serializers.CharField(source="to_config.device_plugin_config", read_only=True)
    from_mig_config = serializers.CharField(source="from_config.mig_config", default=None, read_only=True)

    class Meta:
        model = NodeChange
        fields = ["id", "rollout", "node", "position", "status", "profile", "from_mig_config", "mig_config",
                  "applied_mig_config", "device_plugin_config", "attempts", "cordoned_by_tessera", "deadline",
                  "started_at", "finished_at", "updated_at", "error"]  # fmt: skip


class ProgressSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    finished = serializers.IntegerField(help_text="Nodes that ended, cancelled ones included.")
    done = serializers.IntegerField(help_text="Nodes that ended other than cancelled: they ran, or were skipped.")
    cancelled = serializers.IntegerField()
    percent = serializers.IntegerField(help_text="done / total: cancelled nodes never count as progress.")
    counts = serializers.DictField(child=serializers.IntegerField())


class RolloutSerializer(serializers.ModelSerializer):
    pool = RefField("nodepool-detail", read_only=True)
    profile = RefField("sharingprofile-detail", read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = ["id", "url", "title", "trigger", "actor_label", "pool", "profile", "status", "superseded_by",
                  "batch_size", "canary_count", "max_failures", "on_failure", "accepted_failures", "busy_policy",
                  "wait_minutes", "verify_timeout_seconds", "max_attempts", "progress", "created_at", "finished_at",
                  "updated_at"]  # fmt: skip

    def get_progress(self, rollout) -> ProgressSerializer:
        return rollout_progress(rollout)


class RolloutDetailSerializer(RolloutSerializer):
    changes = NodeChangeSerializer(many=True, read_only=True)

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "changes"]


def _strategy_field(field: StrategyField) -> serializers.Field:
    """An API field of the rollout strategy, bounds and default as the UI form's (sharing.strategy)."""
    common = {"default": partial(strategy_default, field.name), "help_text": f"{field.label}: {field.help_text}"}
    if field.choices:
        return serializers.ChoiceField(choices=field.choices, **common)
    return serializers.IntegerField(min_value=field.min_value, max_value=field.max_value, **common)


# Built from the shared field list; defaults are TESSERA["ROLLOUT_DEFAULTS"], read per request.
RolloutStrategySerializer = type(
    "RolloutStrategySerializer",
    (serializers.Serializer,),
    {
        "__doc__": "How a rollout proceeds; every field defaults to TESSERA_ROLLOUT_* (as in the UI).",
        **{field.name: _strategy_field(field) for field in STRATEGY_FIELDS},
    },
)


class RolloutStartSerializer(RolloutStrategySerializer):
    """Roll the drifted nodes of a pool (or the given nodes) to their desired state with this strategy."""

    pool = serializers.PrimaryKeyRelatedField(queryset=NodePool.objects.all(), required=False)
    nodes = serializers.PrimaryKeyRelatedField(queryset=Node.objects.all(), many=True, required=False)

    def validate(self, attrs):
        if bool(attrs.get("pool")) == bool(attrs.get("nodes")):
            raise serializers.ValidationError({"pool": ["Give either a pool or a list of nodes."]})
        return attrs


class ProfileAssignSerializer(AssignRequestSerializer):
    """Assign a profile to a pool as `mode` says; with `rollout`, also roll it out now with that strategy."""

    rollout = RolloutStrategySerializer(
        required=False,
        help_text="Start a rollout with this strategy in the same transaction ({} for the defaults); without it, "
        "the reconcile loop rolls the change out with its defaults.",
    )


class NodeRetrySerializer(serializers.ModelSerializer):
    """A node waiting out the back-off after its change to `config_id` failed (`failures` > 0), or held back with a
    node of its rollout that failed (`failures` 0): the loop tries again at `next_retry_at`."""

    node = RefField("node-detail", read_only=True)
    node_name = serializers.CharField(source="node.name", read_only=True)
    waiting = serializers.SerializerMethodField()

    class Meta:
        model = NodeRetry
        fields = ["node", "node_name", "config_id", "failures", "next_retry_at", "waiting", "rollout", "error",
                  "updated_at"]  # fmt: skip
        read_only_fields = fields

    def get_waiting(self, retry) -> bool:
        """Whether the back-off still runs (false: the loop retries on its next pass)."""
        return retry.next_retry_at > timezone.now()


class RetryNowSerializer(serializers.Serializer):
    retried = serializers.IntegerField(help_text="nodes whose back-off ended now (0: none was waiting)")


class AdmissionPolicyStateSerializer(serializers.ModelSerializer):
    """A pool's ValidatingAdmissionPolicy and binding (both `object_name`) in its cluster, as last recorded."""

    cluster = RefField("cluster-detail", read_only=True)
    pool = RefField("nodepool-detail", read_only=True)
    qos_policy = RefField("qospolicy-detail", read_only=True)
    resource_versions = serializers.DictField(child=serializers.CharField(), read_only=True)

    class Meta:
        model = AdmissionPolicyState
        fields = ["id", "cluster", "pool", "pool_name", "qos_policy", "policy_name", "object_name", "state",
                  "manifest_hash", "resource_versions", "applied_at", "checked_at", "error", "error_at",
                  "updated_at"]  # fmt: skip
        read_only_fields = fields


class AdmissionPolicyStateDetailSerializer(AdmissionPolicyStateSerializer):
    class Meta(AdmissionPolicyStateSerializer.Meta):
        fields = [*AdmissionPolicyStateSerializer.Meta.fields, "manifest"]
        read_only_fields = fields


class ConfigVerdictSerializer(serializers.Serializer):
    """One config name of the cluster: accepted, or refused with the NVIDIA component's reason and rule."""

    kind = serializers.CharField(help_text="mig-parted or device-plugin")
    name = serializers.CharField()
    accepted = serializers.BooleanField()
    refusal = serializers.CharField(help_text="the component's own reason ('' when accepted)")
    rule = serializers.CharField(help_text="where the rule lives upstream: repository@commit, file, function")
    nodes = serializers.ListField(child=serializers.CharField(), help_text="nodes whose label selects it")
    notes = serializers.ListField(child=serializers.CharField())
    profiles = serializers.ListField(child=serializers.CharField(), help_text="proposed profiles made from it")


class ProposedProfileSerializer(serializers.Serializer):
    """A profile the import would create for a pair of config names, or why it cannot."""

    name = serializers.CharField()
    mig_config = serializers.CharField(allow_null=True)
    device_plugin_config = serializers.CharField(help_text="'' when its nodes carry no label (the default key)")
    products = serializers.ListField(child=serializers.CharField())
    nodes = serializers.ListField(child=serializers.CharField(), help_text="nodes that run this pair now")
    accepted = serializers.BooleanField()
    exists = serializers.SerializerMethodField()
    refusal = serializers.CharField()
    rule = serializers.CharField()
    notes = serializers.ListField(child=serializers.CharField())
    profile = serializers.SerializerMethodField()

    def get_exists(self, proposed) -> bool:
        return proposed.name in self.context["existing"]

    def get_profile(self, proposed) -> dict | None:
        """The sharing profile's fields, as it would be created."""
        spec = proposed.spec
        if spec is None:
            return None
        return {"mode": spec.mode, "target_products": list(spec.target_products),
                "mig_layouts": {k: dict(v) if v is not None else None for k, v in spec.mig_layouts.items()},
                "mig_strategy": spec.mig_strategy, "replicas": spec.replicas, "rename_shared": spec.rename_shared,
                "fail_requests_greater_than_one": spec.fail_requests_greater_than_one}  # fmt: skip


class ImportPreviewSerializer(serializers.Serializer):
    cluster = serializers.CharField(source="plan.cluster")
    policy = serializers.CharField(source="plan.policy", help_text="the ClusterPolicy read")
    problems = serializers.ListField(source="plan.problems", child=serializers.CharField())
    configs = ConfigVerdictSerializer(source="plan.configs", many=True)
    profiles = serializers.SerializerMethodField()
    creatable = serializers.SerializerMethodField()

    def get_profiles(self, preview) -> ProposedProfileSerializer(many=True):
        context = {**self.context, "existing": preview.existing}
        return ProposedProfileSerializer(preview.plan.profiles, many=True, context=context).data

    def get_creatable(self, preview) -> list[str]:
        return [p.name for p in preview.creatable]


class ImportConfirmSerializer(serializers.Serializer):
    names = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="profiles to create; all creatable ones if absent"
    )


class ImportedProfileSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    url = serializers.HyperlinkedIdentityField(view_name="sharingprofile-detail")


class KueueDriftSerializer(serializers.Serializer):
    """One quota Tessera wrote that is no longer there."""

    flavor = serializers.CharField()
    resource = serializers.CharField()
    live = serializers.IntegerField(allow_null=True, help_text="the ClusterQueue's value now; null: absent")
    wrote = serializers.IntegerField(help_text="what Tessera last wrote")


class KueueQuotaWriteSerializer(serializers.ModelSerializer):
    class Meta:
        model = KueueQuotaWrite
        fields = ["cluster_queue", "flavor", "resource", "value", "written_at"]


class KueueBindingSerializer(serializers.ModelSerializer):
    """A pool's Kueue binding: the ClusterQueues whose quota Tessera sets for the pool's flavors, what it last wrote
    there, and the queues it leaves alone because someone else changed a quota it wrote (`drift`)."""

    pool = RefField("nodepool-detail", queryset=NodePool.objects.all(), help_text="fixed once created")
    cluster_queues = serializers.ListField(
        child=serializers.CharField(max_length=253), allow_empty=False, max_length=64
    )
    lead_minutes = serializers.IntegerField(min_value=0, max_value=MAX_LEAD_MINUTES, default=15)
    enabled = serializers.BooleanField(default=True, help_text="false: Tessera stops writing; what it wrote stays")
    drift = serializers.DictField(
        child=KueueDriftSerializer(many=True),
        read_only=True,
        help_text="per ClusterQueue left alone, each value changed outside Tessera; an admin's take-over ends it",
    )
    written = serializers.SerializerMethodField(help_text="the nominalQuota Tessera last wrote, per queue")

    class Meta:
        model = KueueBinding
        fields = ["id", "url", "pool", "enabled", "cluster_queues", "lead_minutes", "drift", "written",
                  "last_error", "synced_at"]  # fmt: skip
        read_only_fields = ["last_error", "synced_at"]

    def validate_pool(self, pool):
        if self.instance is not None and pool != self.instance.pool:
            raise serializers.ValidationError("A binding's pool is fixed once created.")
        other = KueueBinding.objects.filter(pool=pool).exclude(pk=getattr(self.instance, "pk", None)).first()
        if other is not None:
            raise serializers.ValidationError(f"Pool {pool.name} has a Kueue binding already (id {other.pk}).")
        return pool

    def get_written(self, binding) -> KueueQuotaWriteSerializer(many=True):
        rows = KueueQuotaWrite.objects.filter(pool_id=binding.pool_id).order_by("cluster_queue", "flavor", "resource")
        return KueueQuotaWriteSerializer(rows, many=True).data


class KueueTakeOverSerializer(serializers.Serializer):
    cluster_queue = serializers.CharField(help_text="one of the binding's ClusterQueues")

    def validate_cluster_queue(self, value):
        if value not in self.context["binding"].cluster_queues:
            raise serializers.ValidationError(f"{value!r} is not a ClusterQueue of this binding.")
        return value
