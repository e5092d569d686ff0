"""What the machinery records about itself for /metrics and /readyz, written to the database by the process that
did the work (a Celery worker, the cluster watcher) and read at scrape time by whichever web process serves it:
correct with any number of gunicorn workers, Celery workers and hosts, and kept across restarts.

- the reconcile tick's runs (`loop_run`), each node's drift from its desired config (`drift_record`),
- the time node changes spend in each phase (`phase_durations_record`, called by the engine as a change moves),
- each cluster's watch (`watch_record`) and its failed API calls (counted in memory by the driver while HTTP runs
  in threads, written here by `api_errors_flush` after each task and at each watch heartbeat).
"""

import time
from bisect import bisect_left
from collections import Counter
from contextlib import contextmanager
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from fleet.models import Cluster
from worker.drivers.kubernetes.api import take_error_counts
from worker.models import ChangePhaseBucket, ClusterApiErrors, ClusterWatch, LoopRun, NodeDrift
from worker.selectors import Drift

RECONCILE_LOOP = "reconcile"
# Upper bounds (seconds) of the phase-duration histogram's buckets; one more bucket, +Inf, follows.
PHASE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)
CHUNK = 500


@contextmanager
def loop_run(name: str):
    """Record one run of a periodic loop: its start at once (beat's tick arrived), then its duration and outcome."""
    started, clock = timezone.now(), time.perf_counter()
    if not LoopRun.objects.filter(name=name).update(last_started_at=started):
        LoopRun.objects.get_or_create(name=name, defaults={"last_started_at": started})
    try:
        yield
    except BaseException as exc:
        LoopRun.objects.filter(name=name).update(
            runs=F("runs") + 1,
            failures=F("failures") + 1,
            seconds=F("seconds") + (time.perf_counter() - clock),
            last_failure_at=timezone.now(),
            last_error=f"{type(exc).__name__}: {exc}"[:2000],
        )
        raise
    duration = time.perf_counter() - clock
    LoopRun.objects.filter(name=name).update(
        runs=F("runs") + 1,
        seconds=F("seconds") + duration,
        last_success_at=timezone.now(),
        last_duration_seconds=duration,
        last_error="",
    )


def drift_record(drifted: Drift, *, now: datetime, scope: set[int] | None = None) -> None:
    """Replace the recorded drift of the nodes a reconcile pass evaluated (`scope`, an incremental tick's node ids;
    None: a full pass, every node) with what it found: new drifted nodes start their clock now, nodes still drifted
    keep theirs (with the reason of now), nodes back in sync (or out of the pass) are removed."""
    current = {row.node.pk: drifted.reason(row) for row in drifted.rows}
    recorded = dict(NodeDrift.objects.values_list("node_id", "reason"))
    if scope is not None:
        recorded = {pk: reason for pk, reason in recorded.items() if pk in scope}
    gone = [pk for pk in recorded if pk not in current]
    with transaction.atomic():
        for i in range(0, len(gone), CHUNK):
            NodeDrift.objects.filter(node_id__in=gone[i : i + CHUNK]).delete()
        NodeDrift.objects.bulk_create(
            [NodeDrift(node_id=pk, reason=reason, since=now) for pk, reason in current.items() if pk not in recorded],
            batch_size=CHUNK,
            ignore_conflicts=True,
        )
        by_reason: dict[str, list[int]] = {}
        for pk, reason in current.items():
            if pk in recorded and recorded[pk] != reason:
                by_reason.setdefault(reason, []).append(pk)
        for reason, pks in by_reason.items():
            for i in range(0, len(pks), CHUNK):
                NodeDrift.objects.filter(node_id__in=pks[i : i + CHUNK]).update(reason=reason)


def phase_durations_record(phase: str, outcome: str, seconds: list[float]) -> None:
    """Count changes that left `phase` for `outcome` after these many seconds each (cumulative buckets)."""
    if not seconds:
        return
    rows = ChangePhaseBucket.objects.filter(phase=phase, outcome=outcome)
    if not rows.exists():
        ChangePhaseBucket.objects.bulk_create(
            [ChangePhaseBucket(phase=phase, outcome=outcome, bucket=i) for i in range(len(PHASE_BUCKETS) + 1)],
            ignore_conflicts=True,
        )
    for first, n in sorted(Counter(bisect_left(PHASE_BUCKETS, max(0.0, s)) for s in seconds).items()):
        rows.filter(bucket__gte=first).update(count=F("count") + n)
    rows.filter(bucket=len(PHASE_BUCKETS)).update(seconds=F("seconds") + sum(max(0.0, s) for s in seconds))


def watch_record(cluster_id: int, *, connected: bool, error: str = "", listed: bool = False) -> None:
    """The watcher's heartbeat: connected or not (and why), and whether it just completed a full listing."""
    now = timezone.now()
    values = {"heartbeat_at": now, "error": error[:2000]}
    if listed:
        values["listed_at"] = now
    with transaction.atomic():
        watch = ClusterWatch.objects.select_for_update().filter(cluster_id=cluster_id).first()
        if watch is None:
            # PostgreSQL checks foreign keys at commit: a gone cluster is skipped here, not caught below.
            if not Cluster.objects.filter(pk=cluster_id).exists():
                return
            try:
                with transaction.atomic():
                    ClusterWatch.objects.create(cluster_id=cluster_id, connected=connected, since=now, **values)
            except IntegrityError:  # the cluster is gone, or another watcher recorded first
                pass
            return
        if watch.connected != connected:
            values.update(connected=connected, since=now)
        ClusterWatch.objects.filter(cluster_id=cluster_id).update(**values)


def api_errors_flush() -> None:
    """Add the failed API calls this process counted since the last flush to the database."""
    counts = take_error_counts()
    # PostgreSQL checks foreign keys at commit, past the IntegrityError below: errors of gone clusters are dropped.
    live = set(Cluster.objects.filter(pk__in={c for c, _ in counts}).values_list("pk", flat=True))
    for (cluster_id, kind), n in counts.items():
        if cluster_id not in live:
            continue
        if ClusterApiErrors.objects.filter(cluster_id=cluster_id, kind=kind).update(count=F("count") + n):
            continue
        try:
            with transaction.atomic():
                ClusterApiErrors.objects.create(cluster_id=cluster_id, kind=kind, count=n)
        except IntegrityError:  # created meanwhile by another process, or the cluster is gone
            ClusterApiErrors.objects.filter(cluster_id=cluster_id, kind=kind).update(count=F("count") + n)


def flush_after_task(**signal_kwargs) -> None:
    """Celery's task_postrun receiver: what the task's API calls counted goes to the database."""
    api_errors_flush()
