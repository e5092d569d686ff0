"""The config-as-code API's bodies: documents in, a plan (changes field by field, versions, impact) out."""

from rest_framework import serializers

from core.api.fields import ref_to
from scheduling.api.serializers import ScheduleChangeSerializer

DOCUMENTS_HELP = "Documents, one per object (the schema at config/schema/); the client adds none of its own fields."


class DocumentsSerializer(serializers.Serializer):
    documents = serializers.ListField(child=serializers.DictField(), allow_empty=True, help_text=DOCUMENTS_HELP)
    prune = serializers.BooleanField(
        default=False, help_text="Also delete the objects of these kinds that the documents do not name."
    )


class ApplySerializer(DocumentsSerializer):
    dry_run = serializers.BooleanField(default=False, help_text="Check and plan, roll everything back.")
    versions = serializers.DictField(
        child=serializers.CharField(allow_null=True),
        required=False,
        help_text="A plan's `versions`: refused (409) when an object changed on the server since that plan.",
    )
    message = serializers.CharField(
        required=False, default="", allow_blank=True, max_length=2000, help_text="Kept in the audit event (a commit)."
    )


class ExportSerializer(serializers.Serializer):
    documents = serializers.ListField(child=serializers.DictField())
    versions = serializers.DictField(child=serializers.CharField())


class FieldChangeSerializer(serializers.Serializer):
    field = serializers.CharField()
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)


class ChangeSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=["create", "update", "delete"])
    key = serializers.CharField(help_text="Kind and identity, e.g. Pool/prod-east/inference.")
    kind = serializers.CharField()
    document = serializers.IntegerField(allow_null=True, help_text="Index in the request; null: pruned.")
    fields = FieldChangeSerializer(many=True)


class QuotaChangeSerializer(serializers.Serializer):
    flavor = serializers.CharField()
    resource = serializers.CharField()
    before = serializers.IntegerField()
    after = serializers.IntegerField()


class PoolImpactSerializer(serializers.Serializer):
    pool = serializers.SerializerMethodField()
    changes = ScheduleChangeSerializer(many=True, help_text="At once (`now`) and at the next scheduled switch.")
    quota = serializers.ListField(
        child=QuotaChangeSerializer(many=True), help_text="Per change: Kueue quota before → after ([]: no binding)."
    )

    def get_pool(self, impact) -> dict:
        ref = ref_to(impact.pool, "nodepool-detail", self.context.get("request"))
        return {**ref, "cluster": impact.pool.cluster.name}


class PlanSerializer(serializers.Serializer):
    changes = ChangeSerializer(many=True)
    versions = serializers.DictField(
        child=serializers.CharField(allow_null=True), help_text="Every object in scope; null: does not exist yet."
    )
    impact = PoolImpactSerializer(many=True)
    applied = serializers.BooleanField()
    audit_event = serializers.IntegerField(allow_null=True)
