from django.apps import AppConfig


class WorkerConfig(AppConfig):
    """How changes reach nodes: drivers, rollouts and the reconcile loop."""

    name = "worker"

    def ready(self):
        from celery.signals import task_postrun
        from django.db.models.signals import post_migrate, pre_delete, pre_save

        from core import health, metrics
        from fleet.models import Cluster
        from worker import admission, readiness, signals, telemetry  # noqa: F401 - signals connects its receivers
        from worker.metrics import WorkerCollector

        # A cluster's rows must outlive the admission objects they stand for (they deny pods until deleted).
        pre_save.connect(admission.cluster_pre_save, sender=Cluster, dispatch_uid="worker.admission.cluster_pre_save")
        pre_delete.connect(
            admission.cluster_pre_delete, sender=Cluster, dispatch_uid="worker.admission.cluster_pre_delete"
        )
        # API errors counted in memory while a task ran reach the database when it ends (worker.telemetry).
        task_postrun.connect(telemetry.flush_after_task, dispatch_uid="worker.telemetry.api_errors_flush", weak=False)
        # SQLite drops a table's triggers when a migration rebuilds it: the reconcile marks' are re-created each time.
        post_migrate.connect(_marks_install, sender=self, dispatch_uid="worker.marks.install")
        metrics.register("worker", WorkerCollector())
        health.register("watch", readiness.watch_checks)
        health.register("beat", readiness.beat_checks)


def _marks_install(using, **kwargs):
    from django.db import connections

    from worker import marks

    connection = connections[using]
    if (
        marks.MARK_TABLE not in connection.introspection.table_names()
        or marks.installed(connection) >= marks.expected()
    ):
        return  # migrated back before the marks, or every trigger is there
    with connection.schema_editor() as schema_editor:
        marks.install(schema_editor)
