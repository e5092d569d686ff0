"""The worker's tasks as the rest of the code sends them: by name, after the transaction commits (core.enqueue).

Services and signal receivers call these instead of importing worker.tasks, which imports the services: only
Celery loads the tasks module.
"""

from core.enqueue import send_on_commit


def reconcile_tick() -> None:
    """A reconcile pass now rather than at beat's next tick (desired state changed)."""
    send_on_commit("worker.tasks.reconcile_tick")


def rollout_advance(rollout_id: int) -> None:
    send_on_commit("worker.tasks.rollout_advance", (rollout_id,))


def node_changes_step(change_ids: list[int], rollout_id: int) -> None:
    send_on_commit("worker.tasks.node_changes_step", (change_ids, rollout_id))
