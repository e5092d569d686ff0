"""Single sign-on with OpenID Connect: the provider's endpoints (settings, else discovery), and the Tessera account
and role a provider's claims stand for. The OIDC protocol itself is mozilla-django-oidc's (core/backends.py,
core/sign_in.py); docs/security.md#single-sign-on."""

import logging
import time
from dataclasses import dataclass
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.urls import reverse

from core.audit import Actor, audit_record
from core.models import SsoIdentity
from core.roles import ROLE_GROUPS, Role, parse_role_map, role_for_claim_values

logger = logging.getLogger(__name__)

DISCOVERY_TTL = 3600.0  # seconds a discovered configuration is used before it is fetched again
FAILURE_TTL = 30.0  # seconds a failed discovery is reported before it is tried again (no fetch per page view)


class SsoError(Exception):
    """Why single sign-on did not sign someone in, in words fit for the sign-in page (never a secret)."""


class SsoUnavailable(SsoError):
    """The provider's configuration cannot be had (not reachable, not OpenID Connect, another issuer)."""


@dataclass(frozen=True)
class Provider:
    issuer: str  # empty only when every endpoint is set and no issuer is: the ID token's `iss` is then not checked
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    end_session_endpoint: str  # empty: the provider has no RP-initiated logout, signing out is Tessera's alone


_ENDPOINTS = {  # Provider field: (setting, discovery key)
    "authorization_endpoint": ("OIDC_OP_AUTHORIZATION_ENDPOINT", "authorization_endpoint"),
    "token_endpoint": ("OIDC_OP_TOKEN_ENDPOINT", "token_endpoint"),
    "userinfo_endpoint": ("OIDC_OP_USER_ENDPOINT", "userinfo_endpoint"),
    "jwks_uri": ("OIDC_OP_JWKS_ENDPOINT", "jwks_uri"),
}
_cache: dict[tuple, tuple[float, "Provider | SsoUnavailable"]] = {}


def enabled() -> bool:
    """Configured: a client id and an issuer or an authorization endpoint."""
    sso = settings.TESSERA_SSO
    return bool(settings.OIDC_RP_CLIENT_ID and (sso["ISSUER"] or settings.OIDC_OP_AUTHORIZATION_ENDPOINT))


def password_login() -> bool:
    return settings.TESSERA_PASSWORD_LOGIN


def provider_name() -> str:
    return settings.TESSERA_SSO["PROVIDER_NAME"]


def _configured() -> tuple:
    sso = settings.TESSERA_SSO
    return (sso["ISSUER"], sso["END_SESSION_ENDPOINT"], *(getattr(settings, s) for s, _ in _ENDPOINTS.values()))


def provider() -> Provider:
    """The provider's endpoints: those set in settings, the rest from its discovery document, fetched on first use
    and again after an hour. Raises SsoUnavailable, whose message the sign-in page shows."""
    key = _configured()
    now = time.monotonic()
    cached = _cache.get(key)
    if cached is None or cached[0] <= now:
        try:
            result = _resolve(*key)
        except SsoUnavailable as exc:
            logger.warning("single sign-on unavailable: %s (%s)", exc, exc.__cause__ or "no more detail")
            result = exc
        _cache[key] = (now + (FAILURE_TTL if isinstance(result, SsoUnavailable) else DISCOVERY_TTL), result)
        cached = _cache[key]
    if isinstance(cached[1], SsoUnavailable):
        raise cached[1]
    return cached[1]


def forget_provider() -> None:
    """Fetch the discovery document again on next use (tests; a provider that moved)."""
    _cache.clear()


def _resolve(issuer: str, end_session: str, *explicit: str) -> Provider:
    endpoints = dict(zip(_ENDPOINTS, explicit, strict=True))
    if issuer and not (all(endpoints.values()) and end_session):
        document = _discover(issuer)
        for field, (_, key) in _ENDPOINTS.items():
            endpoints[field] = endpoints[field] or document.get(key) or ""
        end_session = end_session or document.get("end_session_endpoint") or ""
    missing = [settings_name for field, (settings_name, _) in _ENDPOINTS.items() if not endpoints[field]]
    if missing:
        source = f"{issuer}'s discovery document" if issuer else "the settings"
        raise SsoUnavailable(f"{source} names no {', '.join(missing)}")
    return Provider(issuer=issuer, end_session_endpoint=end_session, **endpoints)


def _discover(issuer: str) -> dict:
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, allow_redirects=False)
        response.raise_for_status()
        document = response.json()
    except requests.RequestException as exc:
        raise SsoUnavailable(f"{url} could not be read ({failure_in_words(exc)})") from exc
    except ValueError as exc:
        raise SsoUnavailable(f"{url} is not JSON") from exc
    if not isinstance(document, dict):
        raise SsoUnavailable(f"{url} is not an OpenID Connect discovery document")
    if document.get("issuer", "").rstrip("/") != issuer:
        # OpenID Connect Discovery 1.0, 4.3: a document naming another issuer must not be used.
        raise SsoUnavailable(f"{url} names the issuer {document.get('issuer')!r}, not {issuer!r}")
    return document


def failure_in_words(exc: requests.RequestException) -> str:
    """A request's failure in a few words (the full error goes to the log)."""
    if isinstance(exc, requests.Timeout):
        return f"no answer within {settings.OIDC_TIMEOUT:g} s"
    if isinstance(exc, requests.ConnectionError):
        return "connection failed"
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


def status() -> str:
    """Empty when single sign-on can be used, else why not (for the sign-in page)."""
    if not enabled():
        return ""
    try:
        provider()
    except SsoUnavailable as exc:
        return str(exc)
    return ""


def end_session_url(request) -> str:
    """Where signing out sends the browser to end the provider's session too (RP-initiated logout), or "" when this
    session did not come from the provider or the provider has no end-session endpoint. Read before the session
    ends: it holds the ID token."""
    id_token = request.session.get("oidc_id_token")
    if not id_token or not enabled():
        return ""
    try:
        endpoint = provider().end_session_endpoint
    except SsoUnavailable:
        return ""
    if not endpoint:
        return ""
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
            "client_id": settings.OIDC_RP_CLIENT_ID,
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


# --- claims → account and role ---------------------------------------------------------------------------------------


def claim_values(claims: dict, path: str) -> list:
    """The values of a claim as a list: a dotted path reaches into objects (`realm_access.roles`); one string is a
    list of one; absent is empty."""
    value = claims
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def role_from_claims(claims: dict) -> Role:
    sso = settings.TESSERA_SSO
    return role_for_claim_values(claim_values(claims, sso["ROLES_CLAIM"]), parse_role_map(sso["ROLE_MAP"]))


@transaction.atomic
def user_from_claims(claims: dict, *, issuer: str):
    """The account of the subject these verified claims describe, made on its first sign-in, its username, e-mail and
    names updated, and its role set from the claims (a role taken away at the provider is gone here too); a role
    change is audited. Raises SsoError when the claims cannot name an account."""
    sso = settings.TESSERA_SSO
    subject = claims.get("sub")
    username = next((v for v in claim_values(claims, sso["USERNAME_CLAIM"]) if isinstance(v, str)), "").strip()
    if not isinstance(subject, str) or not subject:
        raise SsoError("the provider sent no subject (sub)")
    if not username:
        raise SsoError(f"the provider sent no {sso['USERNAME_CLAIM']} claim (TESSERA_OIDC_USERNAME_CLAIM)")
    user_model = get_user_model()
    if len(username) > user_model._meta.get_field("username").max_length:
        raise SsoError(f"the username {username[:40]!r}… is too long")
    taken = user_model.objects.filter(username=username)
    identity = SsoIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    if identity is None:
        if taken.exists():
            raise SsoError(
                f"the username {username!r} belongs to a local account, which single sign-on never takes over"
            )
        user = user_model.objects.create_user(username)  # no usable password: it signs in through the provider only
        identity = SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    user = identity.user
    if user.username != username and not taken.exists():
        user.username = username  # renamed at the provider
    user.email = claims.get("email") if isinstance(claims.get("email"), str) else user.email
    user.first_name = str(claims.get("given_name") or user.first_name)[:150]
    user.last_name = str(claims.get("family_name") or user.last_name)[:150]
    user.save()
    _set_role(user, role_from_claims(claims))
    return user


def _set_role(user, role: Role) -> None:
    held = set(user.groups.filter(name__in=[r.group_name for r in ROLE_GROUPS]).values_list("name", flat=True))
    before = max((r for r in ROLE_GROUPS if r.group_name in held), default=Role.NONE)
    wanted = {role.group_name} if role else set()
    if held == wanted:
        return
    user.groups.remove(*Group.objects.filter(name__in=held - wanted))
    user.groups.add(*Group.objects.filter(name__in=wanted - held))
    user.__dict__.pop("_tessera_role", None)
    audit_record(
        actor=Actor.system("single sign-on"),
        action="user.set_role",
        obj=user,
        before={"role": before.name.lower()},
        after={"role": role.name.lower()},
        message=f"From the {settings.TESSERA_SSO['ROLES_CLAIM']} claim of {provider_name()} at sign-in.",
    )
