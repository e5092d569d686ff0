"""The caller's identity and role, and rotation of their own API token."""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core import services
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
    """Replace the caller's own API token; the new key is returned once, here."""

    action_roles = {None: Role.VIEWER}

    @extend_schema(request=None, responses=inline_serializer("TokenRotated", {"token": serializers.CharField()}))
    def post(self, request):
        return Response({"token": services.api_token_rotate(user=request.user).key})
