from django.urls import path

from core.api import views

urlpatterns = [
    path("me/", views.MeView.as_view(), name="api-me"),
    path("me/token/rotate/", views.TokenRotateView.as_view(), name="api-token-rotate"),
]
