"""What agents say about applying a desired config: the outcome moves the node's change (worker's state machine)."""

from django.db import transaction
from django.utils import timezone

from agent.protocol import Outcome
from agents.choices import SERVING_STATUSES
from agents.claims import refuse_foreign_uuids
from agents.reports import agent_report_record
from core.exceptions import ApplicationError
from fleet.choices import ConfigState
from fleet.models import Node
from worker.models import NodeChange
from worker.services import node_change_failed_on_node, node_change_refused_busy
from worker.tasks import node_changes_step


def agent_outcome_record(*, node: Node, outcome: Outcome, now=None) -> bool:
    """Record an apply outcome: the fresh report, then what it means for the change. Repeats change nothing; an
    outcome for a change of the node no longer in flight, or for none that exists, only records its report. Returns
    whether the change was acted on. An outcome for another node's change is refused (403), and a report naming
    another node's GPUs (409), before anything is written (the conflict it records stays)."""
    now = now or timezone.now()
    if outcome.change_id is not None and NodeChange.objects.filter(pk=outcome.change_id).exclude(node=node).exists():
        raise ApplicationError(
            f"Change {outcome.change_id} is not one of node {node.name}: an agent reports its own node's changes.",
            status=403,
        )
    refuse_foreign_uuids(node=node, report=outcome.report, now=now)
    return _record_outcome(node, outcome, now)


@transaction.atomic
def _record_outcome(node: Node, outcome: Outcome, now) -> bool:
    # At once, not buffered: the engine's next step reads the processes of this report (busy checks).
    agent_report_record(node=node, report=outcome.report, now=now, buffered=False)
    if outcome.change_id is None:
        return False
    change = NodeChange.objects.filter(pk=outcome.change_id, node=node, status__in=SERVING_STATUSES).first()
    if change is None or change.to_config.get("config_id") != outcome.config_id:
        return False
    if outcome.status == "failed":
        values = {"config_state": ConfigState.FAILED, "last_error": outcome.message[:2000], "updated_at": now}
        if node.config_state != ConfigState.FAILED:
            values["config_state_since"] = now
        if change.applied_mig_config:
            # The config it tried is the one that failed, as the node page shows it.
            values["observed_mig_config"] = change.applied_mig_config
        Node.objects.filter(pk=node.pk).update(**values)
        node_change_failed_on_node(change_id=change.pk, message=outcome.message[:2000])
    elif outcome.status == "refused_busy":
        node_change_refused_busy(change_id=change.pk, message=outcome.message[:2000], now=now)
    transaction.on_commit(lambda: node_changes_step.delay([change.pk], change.rollout_id))
    return True
