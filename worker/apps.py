from django.apps import AppConfig


class WorkerConfig(AppConfig):
    """How changes reach nodes: drivers, rollouts and the reconcile loop."""

    name = "worker"

    def ready(self):
        from django.db.models.signals import pre_delete, pre_save

        from fleet.models import Cluster
        from worker import admission, signals  # noqa: F401 - signals connects its receivers on import

        # A cluster's rows must outlive the admission objects they stand for (they deny pods until deleted).
        pre_save.connect(admission.cluster_pre_save, sender=Cluster, dispatch_uid="worker.admission.cluster_pre_save")
        pre_delete.connect(
            admission.cluster_pre_delete, sender=Cluster, dispatch_uid="worker.admission.cluster_pre_delete"
        )
