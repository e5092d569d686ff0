from django.apps import AppConfig
from django.db.models.signals import post_migrate


def ensure_role_groups(**kwargs):
    """The three role groups always exist after migrate (also after a test flush, which empties tables)."""
    from django.contrib.auth.models import Group

    from core.roles import ROLE_GROUPS

    for role in ROLE_GROUPS:
        Group.objects.get_or_create(name=role.group_name)


class CoreConfig(AppConfig):
    """Cross-cutting pieces: roles, API errors, tokens, audit log, health and metrics endpoints."""

    name = "core"
    verbose_name = "Tessera core"

    def ready(self):
        from celery.signals import before_task_publish

        from core import checks, embedded, health, metrics, queue_stats  # noqa: F401 (checks registers itself)
        from core.api import strict

        strict.install()

        post_migrate.connect(ensure_role_groups, sender=self)
        before_task_publish.connect(queue_stats.stamp_sent_at, dispatch_uid="core.queue_stats.stamp_sent_at")
        metrics.register("core", metrics.BrokerCollector())
        health.register("database", health.database_checks)
        health.register("broker", health.broker_checks)
        health.register("embedded", embedded.embedded_checks)
        metrics.register("embedded", embedded.EmbeddedCollector())
