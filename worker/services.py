"""The node-change engine: advance rollouts and step their node changes (wait/drain → apply → verify → succeed,
fail or roll back), and take in what node agents report about a change.

Every transition is a guarded update committed before the side effect it permits (STYLE §5): a duplicate task,
a second worker or a restarted one finds the row already moved and does nothing twice. Creating and steering
rollouts is worker.rollouts.
"""

import functools
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Count, F, Max
from django.db.models.expressions import Combinable
from django.utils import timezone

from core.audit import Actor, audit_record
from core.models import AuditEvent
from fleet.models import Cluster, Node
from sharing.choices import BusyPolicy, FailurePolicy
from worker import telemetry
from worker.choices import (
    FINISHED_ROLLOUT_STATUSES,
    IN_FLIGHT_STATUSES,
    LIVE_ROLLOUT_STATUSES,
    PROBLEM_STATUSES,
    TERMINAL_CHANGE_STATUSES,
    ChangeStatus,
    RolloutStatus,
)
from worker.drivers import driver_for
from worker.drivers.base import Driver, DriverError, NodeTarget
from worker.models import NodeChange, NodeRetry, Rollout

# One line per rollout that starts or ends (INFO): what a log, and `make run`'s terminal, say of rollouts; the detail
# is in the audit log and on the rollout's page.
rollout_log = logging.getLogger("tessera.rollouts")

# A change not touched for this long while in flight has lost its task (worker crash, lost message): re-step it.
STEP_STALL_SECONDS = 30
WORKER = Actor.system("tessera-worker")  # who the engine's own transitions are audited as


# --- advancing -------------------------------------------------------------------------------------------------------


def _by_cluster(changes: Iterable[NodeChange]) -> dict:
    groups = defaultdict(list)
    for change in changes:
        groups[change.node.cluster].append(change)
    return groups


def _events(changes: Iterable[NodeChange], action: str, *, message: str = "", before=None, after=None, now=None):
    """Append one audit event per change in one statement: the rollout page's event stream and the node history.

    An INSERT … SELECT over the changes' ids, node names joined in the database: the ORM's bulk_create of 1,000
    events cost ~0.2 s of client CPU a transition in a 1,000-node rollout (bench/README.md B3)."""
    ids = sorted({c.pk for c in changes})
    if not ids:
        return
    db = connections[NodeChange.objects.db]
    field = AuditEvent._meta.get_field("before")
    json_values = [None if v is None else field.get_db_prep_value(v, db) for v in (before, after)]
    if db.vendor == "postgresql":
        match, id_params = "= ANY(%s)", [ids]
    else:
        match, id_params = f"IN ({', '.join(['%s'] * len(ids))})", ids
    at = db.ops.adapt_datetimefield_value(now or timezone.now())
    values = [at, WORKER.kind, WORKER.label, action, message]
    with db.cursor() as cursor:
        cursor.execute(_events_sql(db.alias) + match, [*values, *json_values, *id_params])


@functools.cache
def _events_sql(alias: str) -> str:
    """`_events`' statement up to the id match (`= ANY(array)` on PostgreSQL, `IN (…)` elsewhere)."""
    db = connections[alias]
    event, change, node = AuditEvent._meta, NodeChange._meta, Node._meta
    q = db.ops.quote_name
    names = ("at", "actor_kind", "actor_label", "action", "message", "before", "after", "actor", "object_type",
             "object_id", "object_repr")  # fmt: skip
    columns = ", ".join(q(event.get_field(name).column) for name in names)
    json_type = event.get_field("before").db_type(db)
    return (
        f"INSERT INTO {q(event.db_table)} ({columns}) "
        f"SELECT %s, %s, %s, %s, %s, CAST(%s AS {json_type}), CAST(%s AS {json_type}), NULL, "
        f"'nodechange', CAST(c.{q('id')} AS TEXT), "
        f"n.{q('name')} || ' (rollout #' || CAST(c.{q('rollout_id')} AS TEXT) || ')' "
        f"FROM {q(change.db_table)} c INNER JOIN {q(node.db_table)} n ON n.{q('id')} = c.{q('node_id')} "
        f"WHERE c.{q('id')} "
    )


def _claim(changes: Sequence[NodeChange], old: str, new: str, **values) -> list[NodeChange]:
    """Move changes from `old` to `new` if they are still in `old`; only the returned ones may act on the move."""
    if not changes:
        return []
    now = timezone.now()
    with transaction.atomic():
        # Only the changes' rows, in key order: the model's ordering joins the rollout, whose row FOR UPDATE would
        # lock too, and SKIP LOCKED would then skip every change of a rollout another step or advance holds.
        since = dict(
            NodeChange.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk__in=[c.pk for c in changes], status=old)
            .order_by("pk")
            .values_list("pk", "status_since")
        )
        ids = list(since)
        if new in TERMINAL_CHANGE_STATUSES:
            values.setdefault("finished_at", now)
        NodeChange.objects.filter(pk__in=ids).update(status=new, updated_at=now, status_since=now, **values)
        telemetry.phase_durations_record(old, new, [(now - at).total_seconds() for at in since.values()])
        moved = [c for c in changes if c.pk in since]
        for c in moved:
            c.status = new
            for key, value in values.items():
                if not isinstance(value, Combinable):  # F() expressions are re-read when needed
                    setattr(c, key, value)
        _events(moved, f"change.{new}", before={"status": old}, after={"status": new}, message=values.get("error", ""))
    return moved


@transaction.atomic
def rollout_advance(rollout_id: int, *, now=None) -> list[int]:
    """Decide the rollout's next moves: start nodes within batch and canary limits, finish, fail or pause it.

    Returns the ids of changes to step now: the ones just started and in-flight ones whose task looks lost (a
    finished rollout's nodes mid-apply, which finish and verify, included).
    """
    now = now or timezone.now()
    rollout = Rollout.objects.select_for_update().filter(pk=rollout_id).first()
    if rollout is None:
        return []
    stall_cutoff = now - timedelta(seconds=STEP_STALL_SECONDS)
    stalled = list(
        rollout.changes.filter(status__in=IN_FLIGHT_STATUSES, updated_at__lt=stall_cutoff).values_list("pk", flat=True)
    )
    if rollout.status not in LIVE_ROLLOUT_STATUSES:
        return stalled
    counts = dict(rollout.changes.values_list("status").annotate(n=Count("pk")))
    in_flight = sum(counts.get(s, 0) for s in IN_FLIGHT_STATUSES)
    failures = sum(counts.get(s, 0) for s in PROBLEM_STATUSES)
    succeeded = counts.get(ChangeStatus.SUCCEEDED, 0)

    if rollout.status == RolloutStatus.RUNNING and (reason := _failure_stop(rollout, failures, succeeded)):
        if rollout.on_failure == FailurePolicy.PAUSE:
            _set_status(rollout, RolloutStatus.PAUSED, reason + "; paused for a person (resume accepts it)", now)
        else:
            _stop_rollout(rollout, RolloutStatus.FAILED, reason, now, hold=True)
        return stalled
    if not in_flight and not counts.get(ChangeStatus.QUEUED, 0):
        outcome = RolloutStatus.FAILED if failures else RolloutStatus.SUCCEEDED
        if rollout.status == RolloutStatus.RUNNING:
            _stop_rollout(rollout, outcome, "", now)
        return []
    if rollout.status != RolloutStatus.RUNNING:
        return stalled

    capacity = max(0, rollout.batch_size - in_flight)
    if succeeded < rollout.canary_count:
        # Canaries first, alone: the next queued nodes until `canary_count` succeeded (a skipped one is replaced).
        capacity = min(capacity, rollout.canary_count - succeeded - in_flight)
    queued = rollout.changes.filter(status=ChangeStatus.QUEUED).only("pk", "rollout").order_by("position")
    started = _claim(
        list(queued[: max(0, capacity)]),
        ChangeStatus.QUEUED,
        ChangeStatus.WAITING_FOR_IDLE,
        started_at=now,
        deadline=now + timedelta(minutes=rollout.wait_minutes),
    )
    return [c.pk for c in started] + stalled


def _failure_stop(rollout: Rollout, failures: int, succeeded: int) -> str:
    """Why the rollout must stop now ('' if it goes on): a node failed before the canaries succeeded, or failures a
    person has not accepted (by resuming) reached max_failures."""
    new = failures - rollout.accepted_failures
    if new <= 0:
        return ""
    if succeeded < rollout.canary_count:
        last = rollout.changes.filter(status__in=PROBLEM_STATUSES).select_related("node").order_by("-finished_at")
        change = last.first()
        return f"canary {change.node.name} failed: {change.error}"[:1000]
    if new >= rollout.max_failures:
        return f"stopped after {failures} failed node(s)"
    return ""


def rollout_announce(rollout: Rollout, what: str, detail: str = "") -> None:
    """Log that the rollout `what` (started, succeeded, …) once the transaction commits: a rolled-back change never
    reads as done."""
    line = f"Rollout #{rollout.pk} {what}: {rollout.title}" + (f" — {detail}" if detail else "")
    transaction.on_commit(lambda: rollout_log.info(line))


def _set_status(rollout: Rollout, status: str, message: str, now) -> None:
    before = rollout.status
    finished = now if status in FINISHED_ROLLOUT_STATUSES else None
    Rollout.objects.filter(pk=rollout.pk).update(status=status, finished_at=finished, updated_at=now)
    rollout.status = status
    audit_record(
        actor=WORKER,
        action=f"rollout.{status}",
        obj=rollout,
        before={"status": before},
        after={"status": status},
        message=message,
        now=now,
    )
    rollout_announce(rollout, status, message[:200])


def _stop_rollout(rollout: Rollout, status: str, message: str, now, *, hold: bool = False) -> None:
    """End the rollout, cancelling its queued nodes; with `hold`, they wait out the back-off of the node(s) whose
    failure stopped it, so the loop does not start them again at once toward the config that just failed."""
    queued = rollout.changes.filter(status=ChangeStatus.QUEUED)
    held = list(queued.values_list("node_id", "to_config__config_id")) if hold else []
    queued.update(
        status=ChangeStatus.CANCELLED,
        finished_at=now,
        updated_at=now,
        status_since=now,
        error=message or "rollout stopped",
    )
    if held:
        _backoff_hold(rollout, held, message, now)
    _set_status(rollout, status, message, now)


# --- back-off of failed nodes (worker.models.NodeRetry) -----------------------------------------------------------


def backoff_seconds(failures: int) -> int:
    """1, 2, 4 … times RETRY_BACKOFF_SECONDS after the 1st, 2nd, 3rd failure in a row, up to the cap."""
    base, cap = settings.TESSERA["RETRY_BACKOFF_SECONDS"], settings.TESSERA["RETRY_BACKOFF_MAX_SECONDS"]
    return min(base * 2 ** max(0, min(failures - 1, 30)), cap)


def _backoff_record(changes: Iterable[NodeChange], error: str, now) -> None:
    """These changes just failed: their nodes wait longer after each failure at the same config."""
    for change in changes:
        config_id = change.to_config.get("config_id") or ""
        row = NodeRetry.objects.select_for_update().filter(node_id=change.node_id).first()
        failures = row.failures + 1 if row is not None and row.config_id == config_id else 1
        NodeRetry.objects.update_or_create(
            node_id=change.node_id,
            defaults={
                "config_id": config_id,
                "failures": failures,
                "next_retry_at": now + timedelta(seconds=backoff_seconds(failures)),
                "rollout_id": change.rollout_id,
                "error": error,
            },
        )


def _backoff_hold(rollout: Rollout, held: list[tuple[int, str]], message: str, now) -> None:
    """Nodes whose queued changes a failure cancelled wait as long as the failed node(s) of their rollout."""
    until = rollout.retries.filter(failures__gt=0).aggregate(at=Max("next_retry_at"))["at"]
    until = until or now + timedelta(seconds=backoff_seconds(1))
    rows = NodeRetry.objects.select_for_update().in_bulk([node_id for node_id, _ in held])
    for node_id, config_id in held:
        row = rows.get(node_id)
        failures = row.failures if row is not None and row.config_id == config_id else 0
        NodeRetry.objects.update_or_create(
            node_id=node_id,
            defaults={
                "config_id": config_id or "",
                "failures": failures,
                "next_retry_at": max(until, row.next_retry_at) if failures else until,
                "rollout_id": rollout.pk,
                "error": f"held back: rollout #{rollout.pk} {message}",
            },
        )


# --- stepping node changes ---------------------------------------------------------------------------------------


@dataclass
class StepResult:
    """What one step call did: changes still in flight (to poll again) and how many reached an end."""

    active: list[int] = field(default_factory=list)
    finished: int = 0


def node_changes_step(change_ids: Sequence[int], *, now=None) -> StepResult:
    """Move each change as far as it can go now: wait/drain → apply → verify → succeed, fail or roll back.

    The changes are read once; each phase takes the ones read in its status and the ones the phase before just
    moved into it (each move committed by `_claim` before the next phase acts on it)."""
    result = StepResult()
    changes = _step_load(change_ids)
    for status, handler in (
        (ChangeStatus.WAITING_FOR_IDLE, _step_waiting),
        (ChangeStatus.APPLYING, _step_applying),
        (ChangeStatus.VERIFYING, _step_verifying),
    ):
        for cluster, group in _by_cluster(c for c in changes if c.status == status).items():
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


def _step_load(change_ids: Sequence[int]) -> list[NodeChange]:
    """The in-flight changes among these ids with the node columns the steps use; rollouts and clusters read once
    and shared, not joined into every row (a Node row carries five JSON columns)."""
    changes = list(
        NodeChange.objects.filter(pk__in=change_ids, status__in=IN_FLIGHT_STATUSES)
        .select_related("node")
        .only(*(f.name for f in NodeChange._meta.concrete_fields), "node__name", "node__cluster", "node__unschedulable")
    )
    rollouts = Rollout.objects.in_bulk({c.rollout_id for c in changes})
    clusters = Cluster.objects.in_bulk({c.node.cluster_id for c in changes})
    for change in changes:
        change.rollout = rollouts[change.rollout_id]
        change.node.cluster = clusters[change.node.cluster_id]
    return changes


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
        elif policy == BusyPolicy.DRAIN and change.drain_started_at is None:
            drain.append((change, busy))  # drain first, even with a 0-minute wait; then check (`_drain`)
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
        _fail(driver, [change], f"GPUs still in use {_waited(change, now)} by {_pod_names(pods[change.node.name])}")
    if drain:
        _drain(driver, drain, now)


def _waited(change: NodeChange, now) -> str:
    if change.drain_started_at is not None:
        return f"{round((now - change.drain_started_at).total_seconds())} s after the drain began"
    return f"after {change.rollout.wait_minutes} min"


def _pod_names(pods) -> str:
    names = [f"{p.namespace}/{p.name}" for p in pods]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _note(change: NodeChange, text: str) -> None:
    if change.error != text:
        NodeChange.objects.filter(pk=change.pk, status=change.status).update(error=text, updated_at=timezone.now())


def _drain(driver: Driver, draining: list[tuple[NodeChange, list]], now) -> None:
    """Cordon (recorded first, so a crash never leaves a node cordoned by nobody) then evict; 429 means retry later.

    The first eviction starts the drain: from then the pods get at least the verify timeout to go (a 0-minute wait
    means "drain at once", not "fail at once"), or the wait, if longer."""
    starting = [c for c, _ in draining if c.drain_started_at is None]
    for change in starting:
        change.drain_started_at = now
        change.deadline = max(change.deadline or now, now + timedelta(seconds=change.rollout.verify_timeout_seconds))
        NodeChange.objects.filter(pk=change.pk).update(drain_started_at=now, deadline=change.deadline)
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
        if mig_is_ours and state.mig_state == "success" and _dra_plugin_stale(change, state):
            # MIG Manager is done, but a DRA node's kubelet plugin publishes what it found at start: restart it, then
            # judge the new pool.
            driver.restart_dra_plugin(change.node.name)
            _note(change, DRA_RESTART_NOTE)
            continue
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
    verified = _claim(succeeded, ChangeStatus.VERIFYING, ChangeStatus.SUCCEEDED, error="")
    NodeRetry.objects.filter(node_id__in=[c.node_id for c in verified]).delete()  # the config works: no back-off left
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


DRA_RESTART_NOTE = "MIG Manager done; restarted the node's gpu.nvidia.com kubelet plugin to publish the new devices"


def _dra_plugin_stale(change: NodeChange, state) -> bool:
    """A DRA node whose hardware (GFD's labels) already shows the change's devices while its kubelet plugin still
    publishes others, and whose plugin was not restarted for this attempt yet (the note says so; a retry clears it).
    MIG Manager's `success` alone may be the previous config's, read before it saw the new label."""
    if state.dra_plugin_started_at is None or change.error == DRA_RESTART_NOTE:
        return False
    expected = _gpu_resources(change.to_config.get("allocatable"))
    return _gpu_resources(state.dra_hardware) == expected != _gpu_resources(state.allocatable)


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
        with transaction.atomic():  # the failure and its back-off commit together
            moved = _claim([change], change.status, ChangeStatus.FAILED, error=reason)
            _backoff_record(moved, reason, timezone.now())
        failed += moved
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


def node_changes_cancel(changes: Sequence[NodeChange], message: str) -> list[NodeChange]:
    """Cancel changes still queued or waiting for idle GPUs (one that moved on meanwhile is left to finish), and
    uncordon, once committed, the nodes Tessera cordoned to drain. Returns the changes cancelled."""
    moved = []
    for status in (ChangeStatus.QUEUED, ChangeStatus.WAITING_FOR_IDLE):
        moved += _claim([c for c in changes if c.status == status], status, ChangeStatus.CANCELLED, error=message)
    cordoned = [c.pk for c in moved if c.cordoned_by_tessera]
    if cordoned:
        transaction.on_commit(lambda: node_changes_uncordon(cordoned))
    return moved


def node_changes_uncordon(change_ids: Sequence[int]) -> None:
    """Uncordon the nodes of these changes that Tessera cordoned to drain them (a cancelled rollout's waiters)."""
    changes = list(NodeChange.objects.filter(pk__in=change_ids).select_related("node__cluster"))
    for cluster, group in _by_cluster(changes).items():
        errors = driver_for(cluster).set_cordon([c.node.name for c in group], False)
        ok = [c.pk for c in group if c.node.name not in errors]
        NodeChange.objects.filter(pk__in=ok).update(cordoned_by_tessera=False)
