from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The interface layer: pages and commands that compose several apps, importing each one's selectors downward."""

    name = "console"
