from django.apps import AppConfig


class WorkerConfig(AppConfig):
    """How changes reach nodes: drivers, rollouts and the reconcile loop."""

    name = "worker"

    def ready(self):
        from worker import signals  # noqa: F401 - connects the receivers
