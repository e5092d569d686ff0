from django.contrib.auth import views as auth_views
from django.urls import path

from core import views

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("account/token/", views.token_detail, name="token_detail"),
    path("audit/", views.audit_log, name="audit_log"),
]
