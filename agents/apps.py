from django.apps import AppConfig
from django.conf import settings


class AgentsConfig(AppConfig):
    """The node agent's server side: join, report ingest, change outcomes; above worker: outcomes move changes."""

    name = "agents"

    def ready(self):
        """Flush buffered agent reports from this process when TESSERA["AGENT_REPORT_FLUSH_SECONDS"] is above 0."""
        # Here, not at the top: the buffer's statements read models, which load after the app registry.
        from agents.report_buffer import report_buffer

        interval = settings.TESSERA.get("AGENT_REPORT_FLUSH_SECONDS", 0)
        if interval > 0:
            report_buffer.start(interval)
