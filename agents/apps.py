from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """The node agent's server side: join, report ingest, outcomes; above worker because outcomes move changes."""

    name = "agents"
