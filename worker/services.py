"""The node-change engine: advance rollouts and step their node changes (wait/drain → apply → verify → succeed,
fail or roll back), and take in what node agents report about a change.

Every transition is a guarded update committed before the side effect it permits (STYLE §5): a duplicate task,
a second worker or a restarted one finds the row already moved and does nothing twice. Creating and steering
rollouts is worker.rollouts.
"""

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, F
from django.db.models.expressions import Combinable
from django.utils import timezone

from core.audit import Actor, audit_record
from core.models import AuditEvent
from sharing.choices import BusyPolicy
from worker import telemetry
from worker.choices import (
    IN_FLIGHT_STATUSES,
    PROBLEM_STATUSES,
    TERMINAL_CHANGE_STATUSES,
    ChangeStatus,
    RolloutStatus,
)
from worker.drivers import driver_for
from worker.drivers.base import Driver, DriverError, NodeTarget
from worker.models import NodeChange, Rollout

# A change not touched for this long while in flight has lost its task (worker crash, lost message): re-step it.
STEP_STALL_SECONDS = 30


# --- advancing -------------------------------------------------------------------------------------------------------


def _by_cluster(changes: Iterable[NodeChange]) -> dict:
    groups = defaultdict(list)
    for change in changes:
        groups[change.node.cluster].append(change)
    return groups


def _events(changes: Iterable[NodeChange], action: str, *, message: str = "", before=None, after=None, now=None):
    """Append one audit event per change in one query: the rollout page's event stream and the node history."""
    now = now or timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(
            at=now,
            actor_kind=AuditEvent.ActorKind.SYSTEM,
            actor_label="tessera-worker",
            action=action,
            object_type="nodechange",
            object_id=str(c.pk),
            object_repr=f"{c.node.name} (rollout #{c.rollout_id})",
            before=before,
            after=after,
            message=message,
        )
        for c in changes
    )


def _claim(changes: Sequence[NodeChange], old: str, new: str, **values) -> list[NodeChange]:
    """Move changes from `old` to `new` if they are still in `old`; only the returned ones may act on the move."""
    if not changes:
        return []
    now = timezone.now()
    with transaction.atomic():
        since = dict(
            NodeChange.objects.select_for_update(skip_locked=True)
            .filter(pk__in=[c.pk for c in changes], status=old)
            .values_list("pk", "status_since")
        )
        ids = list(since)
        if new in TERMINAL_CHANGE_STATUSES:
            values.setdefault("finished_at", now)
        NodeChange.objects.filter(pk__in=ids).update(status=new, updated_at=now, status_since=now, **values)
        telemetry.phase_durations_record(old, new, [(now - at).total_seconds() for at in since.values()])
        moved = [c for c in changes if c.pk in set(ids)]
        for c in moved:
            c.status = new
            for key, value in values.items():
                if not isinstance(value, Combinable):  # F() expressions are re-read when needed
                    setattr(c, key, value)
        _events(moved, f"change.{new}", before={"status": old}, after={"status": new}, message=values.get("error", ""))
    return moved


@transaction.atomic
def rollout_advance(rollout_id: int, *, now=None) -> list[int]:
    """Decide the rollout's next moves: start nodes within batch and canary limits, finish or stop it.

    Returns the ids of changes to step now: the ones just started and in-flight ones whose task looks lost.
    """
    now = now or timezone.now()
    rollout = Rollout.objects.select_for_update().filter(pk=rollout_id).first()
    if rollout is None or rollout.status not in (RolloutStatus.RUNNING, RolloutStatus.PAUSED):
        return []
    counts = dict(rollout.changes.values_list("status").annotate(n=Count("pk")))
    in_flight = sum(counts.get(s, 0) for s in IN_FLIGHT_STATUSES)
    failures = sum(counts.get(s, 0) for s in PROBLEM_STATUSES)
    stall_cutoff = now - timedelta(seconds=STEP_STALL_SECONDS)
    stalled = list(
        rollout.changes.filter(status__in=IN_FLIGHT_STATUSES, updated_at__lt=stall_cutoff).values_list("pk", flat=True)
    )

    if rollout.status == RolloutStatus.RUNNING and failures >= rollout.max_failures:
        _stop_rollout(rollout, RolloutStatus.FAILED, f"stopped after {failures} failed node(s)", now)
        return stalled
    if not in_flight and not counts.get(ChangeStatus.QUEUED, 0):
        outcome = RolloutStatus.FAILED if failures else RolloutStatus.SUCCEEDED
        if rollout.status == RolloutStatus.RUNNING:
            _stop_rollout(rollout, outcome, "", now)
        return []
    if rollout.status != RolloutStatus.RUNNING:
        return stalled

    queued = rollout.changes.filter(status=ChangeStatus.QUEUED).select_related("node", "rollout").order_by("position")
    canaries_done = rollout.changes.filter(position__lt=rollout.canary_count, status=ChangeStatus.SUCCEEDED).count()
    if canaries_done < min(rollout.canary_count, sum(counts.values())):
        queued = queued.filter(position__lt=rollout.canary_count)  # the rest wait for the canaries
    capacity = max(0, rollout.batch_size - in_flight)
    started = _claim(
        list(queued[:capacity]),
        ChangeStatus.QUEUED,
        ChangeStatus.WAITING_FOR_IDLE,
        started_at=now,
        deadline=now + timedelta(minutes=rollout.wait_minutes),
    )
    return [c.pk for c in started] + stalled


def _stop_rollout(rollout: Rollout, status: str, message: str, now) -> None:
    rollout.changes.filter(status=ChangeStatus.QUEUED).update(
        status=ChangeStatus.CANCELLED,
        finished_at=now,
        updated_at=now,
        status_since=now,
        error=message or "rollout stopped",
    )
    before = rollout.status
    Rollout.objects.filter(pk=rollout.pk).update(status=status, finished_at=now, updated_at=now)
    rollout.status = status
    audit_record(
        actor=Actor.system("tessera-worker"),
        action=f"rollout.{status}",
        obj=rollout,
        before={"status": before},
        after={"status": status},
        message=message,
        now=now,
    )


# --- stepping node changes ---------------------------------------------------------------------------------------


@dataclass
class StepResult:
    """What one step call did: changes still in flight (to poll again) and how many reached an end."""

    active: list[int] = field(default_factory=list)
    finished: int = 0


def node_changes_step(change_ids: Sequence[int], *, now=None) -> StepResult:
    """Move each change as far as it can go now: wait/drain → apply → verify → succeed, fail or roll back."""
    result = StepResult()
    for status, handler in (
        (ChangeStatus.WAITING_FOR_IDLE, _step_waiting),
        (ChangeStatus.APPLYING, _step_applying),
        (ChangeStatus.VERIFYING, _step_verifying),
    ):
        changes = list(
            NodeChange.objects.filter(pk__in=change_ids, status=status).select_related("node__cluster", "rollout")
        )
        for cluster, group in _by_cluster(changes).items():
            try:
                handler(driver_for(cluster), group, now or timezone.now())
            except DriverError as exc:
                if not exc.transient:
                    _fail(driver_for(cluster), group, f"{cluster.name}: {exc}")
                # transient: leave them; the next step (or the stall check) tries again
    rows = NodeChange.objects.filter(pk__in=change_ids).values_list("pk", "status")
    result.active = [pk for pk, status in rows if status in IN_FLIGHT_STATUSES]
    result.finished = sum(1 for _, status in rows if status in TERMINAL_CHANGE_STATUSES)
    # Touch what is still in flight: the lease that tells rollout_advance the task is alive.
    NodeChange.objects.filter(pk__in=result.active).update(updated_at=timezone.now())
    return result


def _needs_idle(change: NodeChange) -> bool:
    """Only a MIG change needs idle GPUs; MIG Manager fails if a pod holds one (§1.2)."""
    target = change.to_config.get("mig_config")
    return bool(target) and target != change.from_config.get("mig_config")


def _step_waiting(driver: Driver, changes: list[NodeChange], now) -> None:
    idle_ok = [c for c in changes if not _needs_idle(c)]
    check = [c for c in changes if _needs_idle(c)]
    pods = driver.busy_pods([c.node.name for c in check]) if check else {}
    ready, skip, fail, drain = list(idle_ok), [], [], []
    for change in check:
        busy = pods.get(change.node.name, [])
        policy = change.rollout.busy_policy
        if not busy or policy == BusyPolicy.FORCE:
            ready.append(change)
        elif policy == BusyPolicy.SKIP:
            skip.append(change)
        elif change.deadline and now > change.deadline:
            fail.append(change)
        elif policy == BusyPolicy.DRAIN:
            drain.append((change, busy))
        else:
            _note(change, "waiting: GPUs in use by " + _pod_names(busy))
    _claim(ready, ChangeStatus.WAITING_FOR_IDLE, ChangeStatus.APPLYING, error="")
    for change in skip:
        _claim([change], ChangeStatus.WAITING_FOR_IDLE, ChangeStatus.SKIPPED,
               error="skipped: GPUs in use by " + _pod_names(pods[change.node.name]))  # fmt: skip
    for change in fail:
        minutes = change.rollout.wait_minutes
        _fail(driver, [change], f"GPUs still in use after {minutes} min by {_pod_names(pods[change.node.name])}")
    if drain:
        _drain(driver, drain)


def _pod_names(pods) -> str:
    names = [f"{p.namespace}/{p.name}" for p in pods]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _note(change: NodeChange, text: str) -> None:
    if change.error != text:
        NodeChange.objects.filter(pk=change.pk, status=change.status).update(error=text, updated_at=timezone.now())


def _drain(driver: Driver, draining: list[tuple[NodeChange, list]]) -> None:
    """Cordon (recorded first, so a crash never leaves a node cordoned by nobody) then evict; 429 means retry later."""
    to_cordon = [c for c, _ in draining if not c.cordoned_by_tessera and not c.node.unschedulable]
    if to_cordon:
        NodeChange.objects.filter(pk__in=[c.pk for c in to_cordon]).update(cordoned_by_tessera=True)
        errors = driver.set_cordon([c.node.name for c in to_cordon], True)
        _events([c for c in to_cordon if c.node.name not in errors], "change.cordon", message="cordoned to drain")
    refused = driver.evict({c.node.name: pods for c, pods in draining})
    for change, pods in draining:
        text = "; ".join(refused.get(change.node.name, [])) or "evicting " + _pod_names(pods)
        _note(change, "draining: " + text)


def _retry_name(mig_config: str, attempt: int) -> str:
    """The same content under a new name: MIG Manager does not retry a value it already has (§1.1)."""
    return f"{mig_config}-r{attempt}"


def _step_applying(driver: Driver, changes: list[NodeChange], now) -> None:
    mig_configs, plugin_configs = {}, {}
    for change in changes:
        to = change.to_config
        if change.applied_mig_config and to.get("mig_parted"):
            # Retries rename the single config inside the rendered file to the label value being written.
            mig_configs[change.applied_mig_config] = to["mig_parted"].replace(
                f"\n  {to['mig_config']}:", f"\n  {change.applied_mig_config}:", 1
            )
        if to["device_plugin_config"]:  # "" (an imported profile's "no label"): the ClusterPolicy default, no key
            plugin_configs[to["device_plugin_config"]] = to["device_plugin"]
    driver.ensure_configs(mig_configs=mig_configs, device_plugin_configs=plugin_configs)
    targets = [
        NodeTarget(c.node.name, c.applied_mig_config or None, c.to_config["device_plugin_config"]) for c in changes
    ]
    errors = driver.apply(targets)
    applied = [c for c in changes if c.node.name not in errors]
    by_rollout = defaultdict(list)
    for change in applied:
        by_rollout[change.rollout].append(change)
    for rollout, group in by_rollout.items():
        for change in _claim(
            group,
            ChangeStatus.APPLYING,
            ChangeStatus.VERIFYING,
            attempts=F("attempts") + 1,
            deadline=now + timedelta(seconds=rollout.verify_timeout_seconds),
            error="",
        ):
            change.attempts += 1
    for change in changes:
        if change.node.name in errors:
            _note(change, f"apply failed, retrying: {errors[change.node.name]}")


def _gpu_resources(allocatable) -> dict:
    return {k: int(v) for k, v in (allocatable or {}).items() if k.startswith("nvidia.com/") and int(v)}


def _step_verifying(driver: Driver, changes: list[NodeChange], now) -> None:
    states = driver.read([c.node.name for c in changes])
    done, failed, retry = [], [], []
    for change in changes:
        state = states.get(change.node.name)
        to = change.to_config
        wants_mig = bool(change.applied_mig_config)
        if state is None or not state.exists:
            failed.append((change, "the node disappeared"))
            continue
        # Agents show the config once applied, Kubernetes as soon as it is labelled: judge only a matching one.
        mig_is_ours = wants_mig and state.mig_config == change.applied_mig_config
        # An agent says which config it runs: until it names this one (a QoS-only change moves neither labels nor
        # resources), nothing it shows is this change's doing.
        applied = state.config_id is None or state.config_id == to["config_id"]
        # An agent's failed state stands until it applies something new: a retry of the same MIG config would read
        # the earlier attempt's failure; agents report this change's failure through its outcome instead.
        if applied and mig_is_ours and state.mig_state == "failed":
            failed.append((change, "MIG Manager reported failed" + (f": {state.error}" if state.error else "")))
        elif (
            applied
            and (not wants_mig or (mig_is_ours and state.mig_state == "success"))
            and state.device_plugin_config == to["device_plugin_config"]
            and _gpu_resources(state.allocatable) == _gpu_resources(to.get("allocatable"))
        ):
            done.append(change)
        elif change.deadline and now > change.deadline:
            wedged = mig_is_ours and state.mig_state in ("pending", "rebooting")
            if wedged and change.attempts < change.rollout.max_attempts:
                retry.append(change)
            else:
                failed.append((change, _timeout_text(change, state)))
    uncordon = [c for c in done if c.cordoned_by_tessera]
    errors = driver.set_cordon([c.node.name for c in uncordon], False) if uncordon else {}
    succeeded = [c for c in done if c.node.name not in errors]
    _claim(succeeded, ChangeStatus.VERIFYING, ChangeStatus.SUCCEEDED, error="")
    for change in retry:
        _claim(
            [change],
            ChangeStatus.VERIFYING,
            ChangeStatus.APPLYING,
            applied_mig_config=_retry_name(change.to_config["mig_config"], change.attempts),
            error=f"still pending after {change.rollout.verify_timeout_seconds} s; retrying under a new config name",
        )
    for change, reason in failed:
        _fail(driver, [change], reason)


def _timeout_text(change: NodeChange, state) -> str:
    seconds = change.rollout.verify_timeout_seconds
    if change.applied_mig_config and state.mig_config != change.applied_mig_config:
        return f"not verified after {seconds} s: the node runs MIG config {state.mig_config!r}, not ours"
    if state.mig_state in ("pending", "rebooting"):
        return f"MIG Manager still {state.mig_state} after {seconds} s (wedged?)"
    expected = _gpu_resources(change.to_config.get("allocatable"))
    return (
        f"not verified after {seconds} s: device plugin config {state.device_plugin_config!r}, "
        f"resources {_gpu_resources(state.allocatable)} (expected {expected})"
    )


def _fail(driver: Driver, changes: list[NodeChange], reason: str) -> list[NodeChange]:
    """Record the failure first, then put the node back on its last good config and uncordon what we cordoned.
    Returns the changes this call failed (another step may have moved them first)."""
    failed = []
    for change in changes:
        failed += _claim([change], change.status, ChangeStatus.FAILED, error=reason)
    # Only a config the node ran successfully is a rollback target; an empty plugin key means "no label" (the
    # device plugin's default), which the driver restores by removing the label.
    rollback = [c for c in failed if c.from_config.get("config_state") == "success"]
    if rollback:
        targets = [
            NodeTarget(c.node.name, c.from_config.get("mig_config"), c.from_config.get("device_plugin_config") or "")
            for c in rollback
        ]
        errors = driver.apply(targets)
        done = [c for c in rollback if c.node.name not in errors]
        _claim(
            done, ChangeStatus.FAILED, ChangeStatus.ROLLED_BACK, error=reason + " — rolled back to the last good config"
        )
    cordoned = [c for c in failed if c.cordoned_by_tessera]
    if cordoned:
        errors = driver.set_cordon([c.node.name for c in cordoned], False)
        NodeChange.objects.filter(pk__in=[c.pk for c in cordoned if c.node.name not in errors]).update(
            cordoned_by_tessera=False
        )
    return failed


def node_change_failed_on_node(*, change_id: int, message: str) -> bool:
    """A node agent reported that applying the change failed: fail it and roll back now rather than at the verify
    deadline (a change that touches no MIG has no MIG state to show the failure). Returns whether it moved."""
    change = NodeChange.objects.select_related("node__cluster", "rollout").filter(pk=change_id).first()
    if change is None or change.status not in (ChangeStatus.APPLYING, ChangeStatus.VERIFYING):
        return False
    return bool(_fail(driver_for(change.node.cluster), [change], f"the agent reported failure: {message}"))


def node_change_refused_busy(*, change_id: int, message: str, now=None) -> bool:
    """A node agent refused to apply because processes held its GPUs, after waiting as the policy said.

    A MIG change goes back to waiting_for_idle with its wait over, so the rollout's busy policy decides at the next
    step from the processes the agent reported (skip, or fail and roll back); the engine checks nothing before other
    changes, so the policy decides here. Returns whether the change moved.
    """
    now = now or timezone.now()
    change = NodeChange.objects.select_related("node__cluster", "rollout").filter(pk=change_id).first()
    if change is None or change.status not in (ChangeStatus.APPLYING, ChangeStatus.VERIFYING):
        return False
    if _needs_idle(change):
        return bool(_claim([change], change.status, ChangeStatus.WAITING_FOR_IDLE, deadline=now, error=message))
    if change.rollout.busy_policy == BusyPolicy.SKIP:
        return bool(_claim([change], change.status, ChangeStatus.SKIPPED, error="skipped: " + message))
    return bool(_fail(driver_for(change.node.cluster), [change], message))


def node_changes_uncordon(change_ids: Sequence[int]) -> None:
    """Uncordon the nodes of these changes that Tessera cordoned to drain them (a cancelled rollout's waiters)."""
    changes = list(NodeChange.objects.filter(pk__in=change_ids).select_related("node__cluster"))
    for cluster, group in _by_cluster(changes).items():
        errors = driver_for(cluster).set_cordon([c.node.name for c in group], False)
        ok = [c.pk for c in group if c.node.name not in errors]
        NodeChange.objects.filter(pk__in=ok).update(cordoned_by_tessera=False)
