"""Prometheus series of the machinery that moves nodes: rollouts, node changes and the time their phases take,
drift from desired state, the reconcile loop, missed schedule transitions, each cluster's watch and API errors, and
Kueue quota changed outside Tessera.

Everything is read from the database at scrape time (worker.telemetry says who writes what). Counters come from
rows that only grow: finished rollouts by outcome, the phase histogram's buckets, API errors; a deleted rollout or
cluster takes its share with it, which Prometheus reads as a counter reset."""

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)

from core.metrics import age_seconds, once_per_scrape, timestamp
from fleet.choices import ClusterDriver
from fleet.models import Cluster
from scheduling.models import KueueBinding
from scheduling.selectors import TRANSITIONS_AROUND_NOW, transitions_around
from worker.choices import ACTIVE_CHANGE_STATUSES, FINISHED_ROLLOUT_STATUSES, RolloutStatus
from worker.models import (
    ChangePhaseBucket,
    ClusterApiErrors,
    ClusterWatch,
    LoopRun,
    NodeChange,
    NodeDrift,
    ReconcileState,
    Rollout,
)
from worker.telemetry import PHASE_BUCKETS, RECONCILE_LOOP

WATCH_HEARTBEAT_STALE_SECONDS = 60  # a connected watcher records a heartbeat every 10 s
SCHEDULE_LOOKBACK = timedelta(hours=24)  # older transitions are not blamed for today's drift


def watch_is_up(watch: ClusterWatch | None, now) -> bool:
    return bool(watch and watch.connected and age_seconds(watch.heartbeat_at, now) < WATCH_HEARTBEAT_STALE_SECONDS)


class WorkerCollector:
    """Rollouts, node changes, drift, the reconcile loop, schedules, cluster watches; one query per family."""

    def collect(self):
        now = timezone.now()
        yield from self._rollouts(now)
        yield from self._changes(now)
        drift_rows = list(
            NodeDrift.objects.values_list("node__cluster__name", "node__pool__name", "node__pool_id", "reason")
            .annotate(n=Count("pk"), since=Min("since"))
            .order_by()
        )
        yield from self._drift(drift_rows, now)
        yield from self._reconcile()
        yield self._schedules(drift_rows, now)
        yield from self._watches(now)
        yield self._kueue()

    def _kueue(self):
        drift = GaugeMetricFamily(
            "tessera_kueue_quota_drift",
            "Per ClusterQueue of an enabled Kueue binding: quota values Tessera wrote that someone else changed (0: in "
            "step); Tessera leaves the queue alone until an admin takes it over.",
            labels=["cluster", "pool", "cluster_queue"],
        )
        bindings = KueueBinding.objects.filter(enabled=True).values_list(
            "pool__cluster__name", "pool__name", "cluster_queues", "drift"
        )
        for cluster, pool, queues, changed in bindings:
            for queue in queues:
                drift.add_metric([cluster, pool, queue], len(changed.get(queue, ())))
        return drift

    def _rollouts(self, now):
        active = GaugeMetricFamily("tessera_rollouts_active", "Rollouts running or paused.", labels=["status"])
        finished = CounterMetricFamily(
            "tessera_rollouts_finished", "Rollouts that ended, by outcome.", labels=["status"]
        )
        counts = dict(Rollout.objects.values_list("status").annotate(n=Count("pk")).order_by())
        for status in (RolloutStatus.RUNNING, RolloutStatus.PAUSED):
            active.add_metric([status], counts.get(status, 0))
        for status in FINISHED_ROLLOUT_STATUSES:
            finished.add_metric([status], counts.get(status, 0))
        paused = GaugeMetricFamily(
            "tessera_rollout_paused_longest_seconds", "How long the longest-paused rollout has been paused (0: none)."
        )
        since = Rollout.objects.filter(status=RolloutStatus.PAUSED).aggregate(since=Min("updated_at"))["since"]
        paused.add_metric([], age_seconds(since, now) or 0.0)
        yield from (active, finished, paused)

    def _changes(self, now):
        active = GaugeMetricFamily(
            "tessera_node_changes_active", "Node changes not finished, by phase.", labels=["cluster", "phase"]
        )
        overdue = GaugeMetricFamily(
            "tessera_node_changes_overdue",
            "Node changes still in a phase past its deadline (waiting for idle GPUs, verifying the result).",
            labels=["cluster", "phase"],
        )
        for cluster, phase, n, late in (
            NodeChange.objects.filter(status__in=ACTIVE_CHANGE_STATUSES)
            .values_list("node__cluster__name", "status")
            .annotate(n=Count("pk"), late=Count("pk", filter=Q(deadline__lt=now)))
            .order_by()
        ):
            active.add_metric([cluster, phase], n)
            overdue.add_metric([cluster, phase], late)
        histogram = HistogramMetricFamily(
            "tessera_node_change_phase_seconds",
            "Time node changes spent in a phase, by the status they left it for (outcome); its _count is the number "
            "of changes that did.",
            labels=["phase", "outcome"],
        )
        buckets: dict[tuple, list] = {}
        sums: dict[tuple, float] = {}
        for phase, outcome, bucket, count, seconds in ChangePhaseBucket.objects.order_by(
            "phase", "outcome", "bucket"
        ).values_list("phase", "outcome", "bucket", "count", "seconds"):
            le = "+Inf" if bucket >= len(PHASE_BUCKETS) else str(float(PHASE_BUCKETS[bucket]))
            buckets.setdefault((phase, outcome), []).append((le, count))
            if le == "+Inf":
                sums[(phase, outcome)] = seconds
        for key, rows in buckets.items():
            if rows[-1][0] == "+Inf":
                histogram.add_metric(list(key), rows, sums[key])
        yield from (active, overdue, histogram)

    def _drift(self, rows, now):
        drifted = GaugeMetricFamily(
            "tessera_nodes_drifted",
            "Nodes whose observed config differs from the desired one, by what holds them back (planned, changing, "
            "failed, invalid), as the last full reconcile pass saw them.",
            labels=["cluster", "pool", "reason"],
        )
        oldest = GaugeMetricFamily(
            "tessera_nodes_drifted_oldest_seconds",
            "How long the longest-drifted node of the group has differed from its desired config.",
            labels=["cluster", "pool", "reason"],
        )
        for cluster, pool, _pool_id, reason, n, since in rows:
            drifted.add_metric([cluster, pool or "", reason], n)
            oldest.add_metric([cluster, pool or "", reason], age_seconds(since, now))
        yield from (drifted, oldest)

    def _reconcile(self):
        run = LoopRun.objects.filter(name=RECONCILE_LOOP).first()
        duration = SummaryMetricFamily(
            "tessera_reconcile_tick_duration_seconds",
            "Reconcile ticks run (count) and the seconds they took (sum).",
            count_value=run.runs if run else 0,
            sum_value=run.seconds if run else 0.0,
        )
        failures = CounterMetricFamily(
            "tessera_reconcile_tick_failures", "Reconcile ticks that raised.", value=run.failures if run else 0
        )
        last = GaugeMetricFamily("tessera_reconcile_last_tick_duration_seconds", "Seconds the last good tick took.")
        success = GaugeMetricFamily(
            "tessera_reconcile_last_success_timestamp_seconds", "When the last reconcile tick succeeded."
        )
        if run is not None and run.last_success_at is not None:
            last.add_metric([], run.last_duration_seconds)
            success.add_metric([], timestamp(run.last_success_at))
        state = ReconcileState.objects.filter(pk=1).only("missed").first()
        missed = CounterMetricFamily(
            "tessera_reconcile_incremental_missed",
            "Drifted nodes a full reconcile pass found that the incremental ticks would not have evaluated (expect 0).",
            value=state.missed if state else 0,
        )
        yield from (duration, failures, last, success, missed)

    def _schedules(self, drift_rows, now):
        """A transition is missed when, past the grace period after it, its pool still has nodes drifting that no
        change is working on (planned but not started, failed or invalid) and that drifted before the grace ended."""
        missed = GaugeMetricFamily(
            "tessera_schedule_transition_missed",
            "1 if the schedule's latest transition left nodes of its pool behind past the grace period, else 0.",
            labels=["cluster", "pool", "schedule"],
        )
        grace = timedelta(seconds=settings.TESSERA.get("SCHEDULE_GRACE_SECONDS", 600))
        behind = {}
        for _cluster, _pool, pool_id, reason, _n, since in drift_rows:
            if reason != NodeDrift.Reason.CHANGING:
                behind[pool_id] = min(since, behind.get(pool_id, since))
        for schedule, (last, _next) in once_per_scrape(TRANSITIONS_AROUND_NOW, transitions_around).items():
            late = (
                last is not None
                and now - SCHEDULE_LOOKBACK <= last.at <= now - grace
                and schedule.pool_id in behind
                and behind[schedule.pool_id] <= last.at + grace
            )
            missed.add_metric([schedule.pool.cluster.name, schedule.pool.name, schedule.name], 1 if late else 0)
        return missed

    def _watches(self, now):
        up = GaugeMetricFamily(
            "tessera_cluster_watch_up",
            "1 if a watcher (manage.py watch_clusters) follows the cluster's nodes and recorded a heartbeat in the "
            "last minute.",
            labels=["cluster"],
        )
        synced = GaugeMetricFamily(
            "tessera_cluster_last_sync_timestamp_seconds",
            "When the cluster's nodes were last listed in full (a watcher starting or resuming after 410 Gone).",
            labels=["cluster"],
        )
        errors = CounterMetricFamily(
            "tessera_cluster_api_errors",
            "Failed calls to the cluster's API server by kind (unreachable, throttled, conflict, server_error, "
            "unauthorized, client_error); each retried attempt counts.",
            labels=["cluster", "kind"],
        )
        watches = {w.cluster_id: w for w in ClusterWatch.objects.all()}
        for pk, name in Cluster.objects.filter(driver=ClusterDriver.KUBERNETES).values_list("pk", "name"):
            watch = watches.get(pk)
            up.add_metric([name], 1 if watch_is_up(watch, now) else 0)
            if watch is not None and watch.listed_at is not None:
                synced.add_metric([name], timestamp(watch.listed_at))
        for name, kind, count in ClusterApiErrors.objects.values_list("cluster__name", "kind", "count"):
            errors.add_metric([name, kind], count)
        yield from (up, synced, errors)
