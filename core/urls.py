from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.decorators.http import require_http_methods

from core import views

urlpatterns = [
    # GET and POST only: Django's view reads PUT as POST, and sends a signed-in user on whatever the method.
    path(
        "login/",
        require_http_methods(["GET", "POST"])(auth_views.LoginView.as_view(redirect_authenticated_user=True)),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("account/token/", views.token_detail, name="token_detail"),
    path("audit/", views.audit_log, name="audit_log"),
]
