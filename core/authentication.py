"""`Authorization: Token <token>` for users' scripts, checked against the stored hash (core/services.py)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication

from core.services import api_token_authenticate

REFUSED = "Invalid or expired token; make a new one on the API token page."


class ApiTokenAuthentication(BaseAuthentication):
    """A user's API token; None without a `Token` header (sessions and agent credentials are tried elsewhere)."""

    keyword = "token"

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "").split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2 or not header[1].isascii():
            raise exceptions.AuthenticationFailed(REFUSED)
        token = api_token_authenticate(header[1])
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed(REFUSED)
        return token.user, token

    def authenticate_header(self, request):
        return "Token"


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The user token in the OpenAPI schema."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "A user's API token, sent as \"Token <token>\"; it acts with the user's role.",
        }
