from django.apps import AppConfig


class ManifestsConfig(AppConfig):
    """Config as code: documents, their schema, plan and apply (docs/config-as-code.md)."""

    name = "manifests"
    verbose_name = "Config as code"
