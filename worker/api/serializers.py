"""Rollouts and node changes as JSON, with progress; input for starting one."""

from rest_framework import serializers

from core.api.fields import RefField
from fleet.models import Node, NodePool
from sharing.choices import BusyPolicy
from worker.models import AdmissionPolicyState, NodeChange, Rollout
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
    finished = serializers.IntegerField()
    percent = serializers.IntegerField()
    counts = serializers.DictField(child=serializers.IntegerField())


class RolloutSerializer(serializers.ModelSerializer):
    pool = RefField("nodepool-detail", read_only=True)
    profile = RefField("sharingprofile-detail", read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = ["id", "url", "title", "trigger", "actor_label", "pool", "profile", "status", "batch_size",
                  "canary_count", "max_failures", "busy_policy", "wait_minutes", "verify_timeout_seconds",
                  "max_attempts", "progress", "created_at", "finished_at", "updated_at"]  # fmt: skip

    def get_progress(self, rollout) -> ProgressSerializer:
        return rollout_progress(rollout)


class RolloutDetailSerializer(RolloutSerializer):
    changes = NodeChangeSerializer(many=True, read_only=True)

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "changes"]


class RolloutStartSerializer(serializers.Serializer):
    """Roll the drifted nodes of a pool (or the given nodes) to their desired state with this strategy."""

    pool = serializers.PrimaryKeyRelatedField(queryset=NodePool.objects.all(), required=False)
    nodes = serializers.PrimaryKeyRelatedField(queryset=Node.objects.all(), many=True, required=False)
    batch_size = serializers.IntegerField(min_value=1, default=10)
    canary_count = serializers.IntegerField(min_value=0, default=1)
    max_failures = serializers.IntegerField(min_value=1, default=1)
    busy_policy = serializers.ChoiceField(choices=BusyPolicy.choices, default=BusyPolicy.WAIT)
    wait_minutes = serializers.IntegerField(min_value=0, max_value=24 * 60, default=30)
    verify_timeout_seconds = serializers.IntegerField(min_value=10, max_value=24 * 3600, default=600)

    def validate(self, attrs):
        if bool(attrs.get("pool")) == bool(attrs.get("nodes")):
            raise serializers.ValidationError("Give either a pool or a list of nodes.")
        return attrs


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
