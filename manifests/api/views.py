"""Config as code (docs/config-as-code.md): export the desired state, its JSON Schema, plan documents against the
server (any role), apply them (admins)."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from core.audit import Actor
from core.roles import Role
from manifests import documents, services
from manifests.api import serializers


class ConfigDocumentsView(APIView):
    """The server's desired state as documents (fields at their default left out) with each object's version."""

    @extend_schema(responses=serializers.ExportSerializer)
    def get(self, request):
        current = documents.current()
        return Response(
            {
                "documents": documents.exported(),
                "versions": {key: documents.version(doc) for key, doc in sorted(current.items())},
            }
        )


class ConfigSchemaView(APIView):
    """The JSON Schema of a document (the client ships the same file)."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request):
        return Response(documents.schema())


def _plan(request, body_class, **fixed) -> Response:
    body = body_class(data=request.data)
    body.is_valid(raise_exception=True)
    values = {**body.validated_data, **fixed}
    result = services.plan_apply(
        actor=Actor.from_request(request),
        docs=values["documents"],
        prune=values["prune"],
        dry_run=values["dry_run"],
        versions=values.get("versions"),
        message=values.get("message", ""),
    )
    return Response(serializers.PlanSerializer(result, context={"request": request}).data)


class ConfigPlanView(APIView):
    """What applying the documents would change, object by object and field by field, and its impact on the nodes
    (the previews' own: now and at the next scheduled switch, Kueue quota); nothing is written."""

    action_roles = {None: Role.VIEWER}

    @extend_schema(request=serializers.DocumentsSerializer, responses=serializers.PlanSerializer)
    def post(self, request):
        return _plan(request, serializers.DocumentsSerializer, dry_run=True)


class ConfigApplyView(APIView):
    """Apply the documents in one transaction (or, with `dry_run`, only plan them); with `versions`, refused (409)
    when an object changed since that plan. One audit event lists every change, with `message`."""

    @extend_schema(request=serializers.ApplySerializer, responses=serializers.PlanSerializer)
    def post(self, request):
        return _plan(request, serializers.ApplySerializer)
