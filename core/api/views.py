"""The caller's identity and role, and rotation of their own API token."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from core import services
from core.api.serializers import AuditEventSerializer
from core.filtersets import AuditEventFilterSet
from core.models import AuditEvent
from core.roles import Role, user_role


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField()


class MeView(APIView):
    """Who the caller is and what role they hold."""

    @extend_schema(responses=MeSerializer)
    def get(self, request):
        return Response({"username": request.user.get_username(), "role": user_role(request.user).name.lower()})


class TokenRotateView(APIView):
    """Replace the caller's own API token; the new token is returned once, here, and never stored in clear."""

    action_roles = {None: Role.VIEWER}

    @extend_schema(
        request=None,
        responses=inline_serializer(
            "TokenRotated", {"token": serializers.CharField(), "expires_at": serializers.DateTimeField(allow_null=True)}
        ),
    )
    def post(self, request):
        token, plain = services.api_token_rotate(user=request.user)
        return Response({"token": plain, "expires_at": token.expires_at}, headers={"Cache-Control": "no-store"})


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The append-only audit log: every desired-state change and rollout transition, newest first."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilterSet
    search_fields = ["actor_label", "object_repr", "message"]
    ordering_fields = ["at"]
