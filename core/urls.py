from django.urls import path

from core import sign_in, views

urlpatterns = [
    path("login/", sign_in.SignInView.as_view(), name="login"),
    path("logout/", sign_in.SignOutView.as_view(), name="logout"),
    # Single sign-on; the redirect URI to register at the provider is <Tessera's URL>/oidc/callback/.
    path("oidc/authenticate/", sign_in.SsoStartView.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", sign_in.SsoCallbackView.as_view(), name="oidc_authentication_callback"),
    path("account/token/", views.token_detail, name="token_detail"),
    path("audit/", views.audit_log, name="audit_log"),
]
