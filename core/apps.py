from django.apps import AppConfig


class CoreConfig(AppConfig):
    """Cross-cutting pieces: roles, API errors, tokens, health and metrics endpoints."""

    name = "core"
    verbose_name = "Tessera core"
