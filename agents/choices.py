"""Which node changes an agent is served."""

from worker.choices import ChangeStatus

# The states in which a change is the node's desired config: the agent applies it and the engine verifies it.
SERVING_STATUSES = (ChangeStatus.APPLYING, ChangeStatus.VERIFYING)
