"""The fleet's tasks as its services send them: by name, after the transaction commits (core.enqueue).

Services call these instead of importing fleet.tasks, which imports the services: only Celery loads the tasks
module.
"""

from core.enqueue import send_on_commit


def pool_apply_selector(pool_id: int) -> None:
    send_on_commit("fleet.tasks.pool_apply_selector", (pool_id,))
