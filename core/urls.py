from django.urls import path
from django.views.decorators.http import require_http_methods

from core import sign_in, views

urlpatterns = [
    # GET and POST only: Django's view reads PUT as POST, and sends a signed-in user on whatever the method.
    path("login/", require_http_methods(["GET", "POST"])(sign_in.SignInView.as_view()), name="login"),
    path("logout/", sign_in.SignOutView.as_view(), name="logout"),
    # Single sign-on; the redirect URI to register at the provider is <Tessera's URL>/oidc/callback/.
    path("oidc/authenticate/", sign_in.SsoStartView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", sign_in.SsoCallbackView.as_view(), name="oidc_authentication_callback"),
    path("account/token/", views.token_detail, name="token_detail"),
    path("audit/", views.audit_log, name="audit_log"),
]
