"""Sending a Celery task by name once the current transaction commits: what each app's `enqueue` module builds on.

By name, so services never import the tasks modules that import them. The task is looked up in the app's registry
and sent with `apply_async`, not `send_task`, so CELERY_TASK_ALWAYS_EAGER (the tests) still runs it in-process.
The registry is filled from every app's tasks module on first use, as a worker does when it starts.
"""

from celery import current_app
from django.db import transaction


def registered_task(name: str):
    """The task registered as `name` (e.g. "worker.tasks.rollout_advance")."""
    if name not in current_app.tasks:
        current_app.autodiscover_tasks(force=True)
    return current_app.tasks[name]


def send_on_commit(name: str, args: tuple = (), **options) -> None:
    """Send task `name` after the transaction in progress commits (at once outside one); `options` as apply_async."""
    transaction.on_commit(lambda: registered_task(name).apply_async(args, **options))
