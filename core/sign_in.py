"""Signing in and out: the password form (unless TESSERA_PASSWORD_LOGIN=false), "Sign in with <provider>" through
OpenID Connect, Django admin's sign-in following the same switch, and sign-out that ends the provider's session
where it can (docs/security.md#single-sign-on)."""

from django.contrib import admin, messages
from django.contrib.auth.views import LoginView, LogoutView, redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from core import sso

PASSWORD_OFF = "Password sign-in is turned off here: sign in with {name}."


class SignInView(LoginView):
    """The sign-in page: single sign-on's button when configured (or why it cannot be used now), the password form
    unless password sign-in is off, in which case a posted password is refused (403) without being checked."""

    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        if sso.password_login():
            return super().post(request, *args, **kwargs)
        context = self.get_context_data(refused=PASSWORD_OFF.format(name=sso.provider_name()))
        return self.render_to_response(context, status=403)

    def get_context_data(self, **kwargs):
        unavailable = sso.status()
        return super().get_context_data(
            password_login=sso.password_login(),
            sso_enabled=sso.enabled(),
            sso_ready=sso.enabled() and not unavailable,
            sso_name=sso.provider_name(),
            sso_unavailable=unavailable,
            **kwargs,
        )


class SignOutView(LogoutView):
    """Django's sign-out, then on to the provider's end-session endpoint when the session came from it."""

    def post(self, request, *args, **kwargs):
        end_session = sso.end_session_url(request)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(end_session) if end_session else response


class SsoStartView(OIDCAuthenticationRequestView):
    """Off to the provider's authorization endpoint (state, nonce and PKCE kept in the session by
    mozilla-django-oidc); back to the sign-in page, saying why, when the provider cannot be used."""

    def get(self, request):
        if not sso.enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = sso.provider().authorization_endpoint
        except sso.SsoUnavailable:
            return redirect("login")  # which says why
        return super().get(request)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The provider's answer: signed in (core.backends.OidcBackend), or back to the sign-in page with the reason."""

    def get(self, request):
        if not sso.enabled():
            raise Http404("Single sign-on is not configured.")
        return super().get(request)

    def login_failure(self):
        user = getattr(self, "user", None)
        if getattr(self.request, "sso_error", ""):
            reason = self.request.sso_error
        elif user is not None and not user.is_active:
            reason = f"the account {user.get_username()} is deactivated in Tessera"
        elif self.request.GET.get("error"):
            reason = f"{self.sso_name} answered {self.request.GET['error'][:100]}"
        else:
            reason = f"{self.sso_name} did not sign you in"
        messages.error(self.request, f"Single sign-on failed: {reason}.")
        return redirect("login")

    @property
    def sso_name(self) -> str:
        return sso.provider_name()


@require_http_methods(["GET", "POST"])  # Django admin's login reads PUT as a GET
def admin_sign_in(request, extra_context=None):
    """Django admin's sign-in: its password form while password sign-in is on; otherwise Tessera's sign-in page,
    and a signed-in account that is no staff member is told so (instead of bouncing between the two pages)."""
    if sso.password_login():
        return admin.site.login(request, extra_context)
    if request.user.is_authenticated:
        raise PermissionDenied("Django admin needs a staff account.")
    return redirect_to_login(request.GET.get("next") or reverse("admin:index"))
