"""Authentication backends: local passwords, which TESSERA_PASSWORD_LOGIN=false switches off, and OpenID Connect,
which signs in only from the callback of a sign-in the provider completed (docs/security.md#single-sign-on)."""

import logging

import jwt
import requests
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from core import sso

logger = logging.getLogger(__name__)


class PasswordBackend(ModelBackend):
    """Django's username and password, unless password sign-in is off: then no password signs anyone in (the UI's
    form, Django admin's), and sessions that a password opened end at their next request."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        return super().authenticate(request, username, password, **kwargs) if sso.password_login() else None

    def get_user(self, user_id):
        return super().get_user(user_id) if sso.password_login() else None


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code flow (token exchange, ID token signature and nonce, PKCE) with the endpoints of
    core.sso.provider(), the ID token's issuer and audience checked, and the account and role of core.sso. A failure
    leaves its reason on `request.sso_error` for the sign-in page."""

    def authenticate(self, request, nonce=None, code_verifier=None, **credentials):
        if request is None or nonce is None or credentials or not sso.enabled():
            return None  # a password sign-in, or not the callback
        try:
            provider = sso.provider()
            self.OIDC_OP_TOKEN_ENDPOINT = provider.token_endpoint
            self.OIDC_OP_USER_ENDPOINT = provider.userinfo_endpoint
            self.OIDC_OP_JWKS_ENDPOINT = provider.jwks_uri
            self.issuer = provider.issuer
            return super().authenticate(request, nonce=nonce, code_verifier=code_verifier)
        except (sso.SsoError, SuspiciousOperation, jwt.InvalidTokenError) as exc:
            request.sso_error = str(exc).rstrip(".")
        except requests.RequestException as exc:
            # The error's text may quote the provider's answer: logged, not shown.
            logger.warning("single sign-on: the provider could not be reached or refused: %s", exc)
            request.sso_error = f"the provider did not answer as expected ({sso.failure_in_words(exc)})"
        return None

    def retrieve_matching_jwk(self, token):
        """The key by the token's key id; a token without one (OpenID Connect Core 10.1 allows it when the provider
        has a single signing key, as oidc-provider-mock does) gets that single key, or is refused."""
        if "kid" in jwt.get_unverified_header(token):
            return super().retrieve_matching_jwk(token)
        response = requests.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        keys = [key for key in response.json().get("keys", []) if key.get("use", "sig") == "sig"]
        if len(keys) != 1:
            raise SuspiciousOperation("the ID token names no key id and the provider has several signing keys")
        return jwt.PyJWK(keys[0])

    def get_or_create_user(self, access_token, id_token, payload):
        """`payload` is the ID token, its signature, expiry and nonce checked by mozilla-django-oidc."""
        if self.issuer and str(payload.get("iss", "")).rstrip("/") != self.issuer:
            raise sso.SsoError(f"the ID token was issued by {payload.get('iss')!r}, not {self.issuer!r}")
        audience = payload.get("aud")
        if settings.OIDC_RP_CLIENT_ID not in (audience if isinstance(audience, list) else [audience]):
            raise sso.SsoError("the ID token is not meant for Tessera's client id")
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload.get("sub"):
            raise sso.SsoError("the provider's userinfo is about another subject than its ID token")
        # Providers put groups in the ID token, the userinfo, or both: both are read, userinfo winning.
        return sso.user_from_claims({**payload, **userinfo}, issuer=self.issuer or str(payload.get("iss", "")))
