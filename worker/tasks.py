"""Celery tasks of the worker: the reconcile tick and the rollout steps. Thin, idempotent, taking ids."""

import logging

from celery import shared_task
from django.conf import settings
from django.db.models import Q

from core.periodic import OncePerPeriod
from core.retention import PRUNE_SOFT_TIME_LIMIT, PRUNE_TIME_LIMIT
from fleet.models import Cluster, NodePool
from scheduling.services import pool_compliance_check
from sharing import services as sharing_services
from worker import admission as admission_module
from worker import kueue as kueue_module
from worker import reconcile as reconcile_module
from worker import services, telemetry
from worker.choices import IN_FLIGHT_STATUSES, RolloutStatus
from worker.drivers.base import DriverError
from worker.drivers.kubernetes.api import error_text, is_transient
from worker.inventory.cluster import cluster_health, scrape_metrics
from worker.inventory.pods import sync_pods
from worker.models import Rollout
from worker.retention import worker_prune

log = logging.getLogger(__name__)

STEP_CHUNK = 50
RECONCILE_TICK_SECONDS = 30  # beat's period for the tick (TESSERA_RECONCILE_SECONDS); it re-sends what expired


@shared_task(base=OncePerPeriod, soft_time_limit=50, time_limit=60, expires=60)
def reconcile_tick() -> dict:
    """Beat's tick: remove pins past their end, turn drift into rollouts (incrementally: worker/reconcile.py), then
    nudge every running rollout (recovers lost step tasks); clusters whose admission policies no longer match their
    pools' QoS policies (a window began, a policy changed) are synced at once."""
    with telemetry.loop_run(telemetry.RECONCILE_LOOP):
        expired = sharing_services.pins_expire()
        created = reconcile_module.reconcile(full=False)
        if reconcile_module.full_pass_request():
            reconcile_full.apply_async(expires=reconcile_module.FULL_PASS_MAX_SECONDS)
        # Running rollouts start their next nodes; any other with nodes mid-apply (paused, cancelled, superseded)
        # gets its lost step tasks back.
        moving = Q(status=RolloutStatus.RUNNING) | Q(changes__status__in=IN_FLIGHT_STATUSES)
        active = list(Rollout.objects.filter(moving).values_list("pk", flat=True).distinct())
        for rollout_id in active:
            rollout_advance.apply_async((rollout_id,), expires=RECONCILE_TICK_SECONDS)
        admission = admission_module.clusters_out_of_date()
        for cluster_id in admission:
            admission_sync.apply_async((cluster_id,), expires=ADMISSION_TICK_SECONDS)
        kueue_pools = kueue_module.bindings_to_sync()
        for pool_id in kueue_pools:
            kueue_sync.apply_async((pool_id,), expires=RECONCILE_TICK_SECONDS)
    return {
        "created": created,
        "advanced": len(active),
        "admission": len(admission),
        "pins_expired": expired,
        "kueue": len(kueue_pools),
    }


@shared_task(
    soft_time_limit=reconcile_module.FULL_PASS_MAX_SECONDS - 30, time_limit=reconcile_module.FULL_PASS_MAX_SECONDS
)
def reconcile_full() -> dict:
    """The loop's safety net, sent by the tick when due: a pass over every node that also counts what the incremental
    ticks missed (worker/reconcile.py). Its own task: at 100,000 nodes it takes longer than a tick may."""
    return {"created": reconcile_module.reconcile(full=True)}


@shared_task(soft_time_limit=25, time_limit=30)
def kueue_sync(pool_id: int) -> dict:
    """Keep one pool's Kueue flavors and quota in step with its layout (worker/kueue.py); idempotent."""
    return kueue_module.kueue_sync(pool_id)


@shared_task(base=OncePerPeriod, soft_time_limit=50, time_limit=60)
def kueue_workloads_sample() -> dict:
    """Beat's read of Kueue Workloads into the capacity sample (one task per cluster with an enabled binding)."""
    clusters = kueue_module.workload_clusters()
    for cluster_id in clusters:
        kueue_workloads_sample_cluster.delay(cluster_id)
    return {"clusters": len(clusters)}


@shared_task(soft_time_limit=110, time_limit=120)
def kueue_workloads_sample_cluster(cluster_id: int) -> int | str:
    """One cluster's Workloads into the current capacity bucket (worker/kueue.py); idempotent per bucket."""
    return kueue_module.kueue_workloads_sample(cluster_id)


@shared_task(soft_time_limit=50, time_limit=60)
def rollout_advance(rollout_id: int) -> int:
    """Start the next nodes of a rollout (or finish it) and fan the steps out in small chunks."""
    change_ids = services.rollout_advance(rollout_id)
    for i in range(0, len(change_ids), STEP_CHUNK):
        node_changes_step.delay(change_ids[i : i + STEP_CHUNK], rollout_id)
    return len(change_ids)


@shared_task(bind=True, soft_time_limit=110, time_limit=120)
def node_changes_step(self, change_ids: list[int], rollout_id: int) -> dict:
    """Step a chunk of node changes; poll again while some are in flight, advance the rollout when some finish."""
    result = services.node_changes_step(change_ids)
    if result.finished:
        rollout_advance.delay(rollout_id)
    # Run in-process (eager, in tests) a countdown cannot wait: polling is then left to the next tick.
    if result.active and not self.request.is_eager:
        node_changes_step.apply_async((result.active, rollout_id), countdown=settings.TESSERA["STEP_POLL_SECONDS"])
    return {"active": len(result.active), "finished": result.finished}


@shared_task(base=OncePerPeriod, soft_time_limit=50, time_limit=60, expires=240)
def qos_compliance_refresh() -> int:
    """Beat's tick for QoS: one compliance check per pool that has a policy now or had a report before."""
    pool_ids = list(NodePool.objects.values_list("pk", flat=True))
    for pool_id in pool_ids:
        qos_compliance_check.apply_async((pool_id,), expires=240)
    return len(pool_ids)


@shared_task(soft_time_limit=110, time_limit=120)
def qos_compliance_check(pool_id: int) -> int:
    """Check one pool's pods against the QoS policy in force now (schedule window, baseline or pool default)."""
    return pool_compliance_check(pool_id)


# --- Kubernetes inventory (the watch itself runs in `manage.py watch_clusters`) -------------------------------------

INVENTORY_TICK_SECONDS = 30  # beat's period for both ticks below; a task older than one period is dropped


def _kubernetes_cluster(cluster_id: int):
    return Cluster.objects.filter(pk=cluster_id, driver="kubernetes").first()


def _fan_out(task, expires: float) -> int:
    ids = list(Cluster.objects.filter(driver="kubernetes").values_list("pk", flat=True))
    for cluster_id in ids:
        task.apply_async((cluster_id,), expires=expires)
    return len(ids)


@shared_task(base=OncePerPeriod, soft_time_limit=20, time_limit=30, expires=30)
def clusters_scrape_metrics() -> int:
    """Beat's tick: one metrics scrape per Kubernetes cluster (expiring, so a backlog never piles up)."""
    return _fan_out(cluster_scrape_metrics, INVENTORY_TICK_SECONDS)


def _unless_unavailable(cluster, work, what: str):
    """`work(cluster)`, or None when the cluster cannot be read now: its API server or metrics endpoint down (after
    the calls' own retries), its kubeconfig unreadable (a restarting simulator rewrites it; an admin replacing it).
    The health check shows those states and the next tick tries again: one warning line, not a failed task with a
    traceback. Anything else still fails the task."""
    try:
        return work(cluster)
    except Exception as exc:
        if not (isinstance(exc, DriverError) or is_transient(exc)):
            raise
        log.warning("cluster %s: %s skipped this round: %s", cluster.name, what, error_text(exc))
        return None


@shared_task(soft_time_limit=110, time_limit=120)
def cluster_scrape_metrics(cluster_id: int) -> dict:
    """GPUs, MIG devices and utilisation of one cluster from dcgm-exporter."""
    cluster = _kubernetes_cluster(cluster_id)
    result = _unless_unavailable(cluster, scrape_metrics, "metrics scrape") if cluster is not None else None
    if result is None:
        return {"gpus": 0}
    return {"nodes": result.nodes, "gpus": result.gpus, "metrics": result.metrics_recorded}


@shared_task(base=OncePerPeriod, soft_time_limit=20, time_limit=30, expires=30)
def clusters_sync_pods() -> int:
    """Beat's tick: one GPU-pod sync per Kubernetes cluster."""
    return _fan_out(cluster_sync_pods, INVENTORY_TICK_SECONDS)


@shared_task(soft_time_limit=110, time_limit=120)
def cluster_sync_pods(cluster_id: int) -> int:
    """The GPU-holding pods of one cluster, per node (busy checks, impact previews, QoS rules)."""
    cluster = _kubernetes_cluster(cluster_id)
    return (_unless_unavailable(cluster, sync_pods, "pod sync") if cluster is not None else None) or 0


@shared_task(soft_time_limit=50, time_limit=60)
def cluster_check_health(cluster_id: int) -> str:
    """The cluster health check, stored on the cluster; returns the problem ('' when healthy)."""
    cluster = _kubernetes_cluster(cluster_id)
    return (cluster_health(cluster).problem or "") if cluster is not None else ""


# --- admission policies (QoS policies enforced by the API server) ----------------------------------------------------

ADMISSION_TICK_SECONDS = 60  # beat's period for the sweep below


@shared_task(base=OncePerPeriod, soft_time_limit=20, time_limit=30, expires=ADMISSION_TICK_SECONDS)
def clusters_sync_admission() -> int:
    """Beat's sweep: one admission sync per cluster that enforces a QoS policy at admission or did (retries errors,
    repairs objects changed or deleted in the cluster)."""
    ids = admission_module.clusters_to_sync()
    for cluster_id in ids:
        admission_sync.apply_async((cluster_id,), expires=ADMISSION_TICK_SECONDS)
    return len(ids)


@shared_task(soft_time_limit=50, time_limit=60)
def admission_sync(cluster_id: int) -> dict:
    """Create, replace or delete one cluster's ValidatingAdmissionPolicies so they match its pools' QoS policies; a
    pass already running there makes this one return at once (the tick and the sweep both enqueue)."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return {}
    return admission_module.admission_sync(cluster=cluster).as_dict()


@shared_task(base=OncePerPeriod, soft_time_limit=PRUNE_SOFT_TIME_LIMIT, time_limit=PRUNE_TIME_LIMIT)
def retention_prune() -> dict:
    """Beat's daily prune of rollout history: rollouts finished long ago, with their node changes."""
    return worker_prune()
