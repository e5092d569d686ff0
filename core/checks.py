"""`manage.py check` (and so migrate) refuses single sign-on settings that cannot work, before anyone signs in."""

from django.conf import settings
from django.core.checks import Error, Warning, register

from core import sso
from core.roles import parse_role_map


@register("security")
def sso_settings(app_configs, **kwargs):
    problems = []
    try:
        role_map = parse_role_map(settings.TESSERA_SSO["ROLE_MAP"])
    except ValueError as exc:
        role_map = {}
        problems.append(Error(f"TESSERA_OIDC_ROLE_MAP: {exc}.", id="tessera.E101"))
    configured = settings.TESSERA_SSO["ISSUER"] or settings.OIDC_OP_AUTHORIZATION_ENDPOINT
    if configured and not settings.OIDC_RP_CLIENT_ID:
        problems.append(Error("Single sign-on needs TESSERA_OIDC_CLIENT_ID.", id="tessera.E102"))
    if not sso.password_login() and not sso.enabled():
        problems.append(
            Error(
                "TESSERA_PASSWORD_LOGIN=false with no single sign-on configured: nobody could sign in.",
                hint="Set TESSERA_OIDC_ISSUER and TESSERA_OIDC_CLIENT_ID, or TESSERA_PASSWORD_LOGIN=true.",
                id="tessera.E103",
            )
        )
    if sso.enabled() and not role_map and not problems:
        problems.append(
            Warning(
                "Single sign-on without TESSERA_OIDC_ROLE_MAP: every account it makes signs in without a role.",
                id="tessera.W101",
            )
        )
    return problems
