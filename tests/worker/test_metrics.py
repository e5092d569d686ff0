"""What the worker records for /metrics and /readyz (worker.telemetry) and how its collector reports it."""

import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone
from kubernetes.client.exceptions import ApiException

from scheduling.models import KueueBinding, Schedule, ScheduleWindow
from sharing.models import SharingProfile
from tests.factories import ClusterFactory, NodeFactory, NodePoolFactory
from worker import telemetry
from worker.drivers.kubernetes import api as k8s
from worker.models import ClusterApiErrors, LoopRun, NodeChange, NodeDrift, NodeRetry, Rollout
from worker.selectors import Drift
from worker.services import rollout_advance

pytestmark = pytest.mark.django_db


def one(samples: dict, **labels) -> float:
    """The value of the one sample whose labels include `labels`."""
    (value,) = [v for k, v in samples.items() if labels.items() <= dict(k).items()]
    return value


def drift_of(*pairs) -> Drift:
    """A Drift of (node, reason) pairs, as worker.selectors.drift would compute it."""
    rows = [SimpleNamespace(node=node, config=None if reason == "invalid" else object()) for node, reason in pairs]
    busy = {node.pk for node, reason in pairs if reason == "changing"}
    backoff = {
        node.pk: NodeRetry(failures=int(reason == "failed")) for node, reason in pairs if reason in ("failed", "held")
    }
    return Drift(rows, busy, backoff)


def test_drift_keeps_its_clock_while_the_node_keeps_differing(scrape):
    pool = NodePoolFactory(name="a100")
    a, b = NodeFactory(cluster=pool.cluster, pool=pool), NodeFactory(cluster=pool.cluster, pool=pool)
    start = timezone.now() - timedelta(minutes=40)
    telemetry.drift_record(drift_of((a, "planned"), (b, "invalid")), now=start)
    telemetry.drift_record(drift_of((a, "changing")), now=start + timedelta(minutes=1))
    assert dict(NodeDrift.objects.values_list("node_id", "reason")) == {a.pk: "changing"}
    assert NodeDrift.objects.get().since == start  # still the same drift: its clock kept running
    samples = scrape()
    assert one(samples["tessera_nodes_drifted"], pool="a100", reason="changing") == 1
    assert one(samples["tessera_nodes_drifted_oldest_seconds"], pool="a100") == pytest.approx(2400, abs=30)
    telemetry.drift_record(drift_of(), now=timezone.now())
    assert not NodeDrift.objects.exists()


def test_phase_durations_are_a_cumulative_histogram(scrape):
    telemetry.phase_durations_record("verifying", "succeeded", [0.5, 20.0, 4000.0])
    telemetry.phase_durations_record("verifying", "succeeded", [20.0])
    samples = scrape()
    buckets = {dict(k)["le"]: v for k, v in samples["tessera_node_change_phase_seconds_bucket"].items()}
    assert buckets["1.0"] == 1 and buckets["15.0"] == 1 and buckets["30.0"] == 3 and buckets["3600.0"] == 3
    assert buckets["+Inf"] == 4
    assert one(samples["tessera_node_change_phase_seconds_count"], phase="verifying", outcome="succeeded") == 4
    assert one(samples["tessera_node_change_phase_seconds_sum"], phase="verifying") == pytest.approx(4040.5)


def test_the_engine_records_the_phase_a_change_leaves(scrape):
    node = NodeFactory()
    rollout = Rollout.objects.create(title="t", trigger="user", actor_label="test", canary_count=0)
    NodeChange.objects.create(
        rollout=rollout, node=node, position=0, status_since=timezone.now() - timedelta(seconds=40)
    )
    rollout_advance(rollout.pk)
    samples = scrape()
    assert one(samples["tessera_node_change_phase_seconds_count"], phase="queued", outcome="waiting_for_idle") == 1
    assert one(samples["tessera_node_change_phase_seconds_bucket"], phase="queued", le="60.0") == 1
    assert one(samples["tessera_node_change_phase_seconds_bucket"], phase="queued", le="30.0") == 0
    assert one(samples["tessera_node_changes_active"], phase="waiting_for_idle") == 1
    assert one(samples["tessera_node_changes_overdue"], phase="waiting_for_idle") == 0
    assert one(samples["tessera_rollouts_active"], status="running") == 1


def test_reconcile_runs_and_beat_readiness(scrape, client):
    with telemetry.loop_run(telemetry.RECONCILE_LOOP):
        pass
    with pytest.raises(RuntimeError), telemetry.loop_run(telemetry.RECONCILE_LOOP):
        raise RuntimeError("database gone")
    run = LoopRun.objects.get()
    assert (run.runs, run.failures) == (2, 1) and run.last_error == "RuntimeError: database gone"
    samples = scrape()
    assert samples["tessera_reconcile_tick_duration_seconds_count"][()] == 2
    assert samples["tessera_reconcile_tick_failures_total"][()] == 1
    assert samples["tessera_reconcile_last_success_timestamp_seconds"][()] == pytest.approx(
        run.last_success_at.timestamp()
    )
    beat = client.get("/readyz").json()["checks"]["beat"]
    assert beat["ok"] and re.match(
        r"last reconcile tick \d+ s ago \(every 30 s\); it failed: RuntimeError", beat["detail"]
    )
    LoopRun.objects.update(last_started_at=timezone.now() - timedelta(minutes=5))
    assert not client.get("/readyz").json()["checks"]["beat"]["ok"]


def test_watch_heartbeat_and_readiness(scrape, client, viewer):
    cluster = ClusterFactory(name="east")
    client.force_login(viewer)  # /readyz's details are for viewers (and the metrics token)
    checks = client.get("/readyz").json()["checks"]
    assert checks["watch:east"] == {
        "ok": False,
        "required": False,
        "detail": "never watched: is `manage.py watch_clusters` running?",
    }
    telemetry.watch_record(cluster.pk, connected=True, listed=True)
    samples = scrape()
    assert samples["tessera_cluster_watch_up"][(("cluster", "east"),)] == 1
    assert (("cluster", "east"),) in samples["tessera_cluster_last_sync_timestamp_seconds"]
    assert client.get("/readyz").json()["checks"]["watch:east"]["ok"]
    telemetry.watch_record(cluster.pk, connected=False, error="east: API server unreachable (ConnectionError)")
    assert scrape()["tessera_cluster_watch_up"][(("cluster", "east"),)] == 0
    detail = client.get("/readyz").json()["checks"]["watch:east"]["detail"]
    assert re.match(r"disconnected for \d+ s: east: API server unreachable", detail)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ApiException(status=429), "throttled"),
        (ApiException(status=409), "conflict"),
        (ApiException(status=503), "server_error"),
        (ApiException(status=403), "unauthorized"),
        (ApiException(status=422), "client_error"),
        (ApiException(status=0, reason="refused"), "unreachable"),
        (ConnectionResetError(), "unreachable"),
        (ApiException(status=404), None),
        (ApiException(status=410), None),
    ],
)
def test_api_error_kinds(error, kind):
    assert k8s.error_kind(error) == kind


def test_failed_api_calls_are_counted_per_cluster(scrape):
    k8s.take_error_counts()  # what earlier tests' calls left in this process's memory
    cluster = ClusterFactory(name="west")

    class Api:  # a generated API method's owner, as k8s.call sees it
        api_client = SimpleNamespace(tessera_cluster_id=cluster.pk)

        def read(self, **kwargs):
            raise ApiException(status=503)

    with pytest.raises(ApiException):
        k8s.with_retries(lambda: k8s.call(Api().read, retry_if=lambda exc: False), attempts=1)
    k8s.count_error(cluster.pk, ApiException(status=429))
    telemetry.api_errors_flush()
    k8s.count_error(cluster.pk, ApiException(status=429))
    telemetry.flush_after_task()
    assert dict(ClusterApiErrors.objects.values_list("kind", "count")) == {"server_error": 1, "throttled": 2}
    samples = scrape()["tessera_cluster_api_errors_total"]
    assert samples[(("cluster", "west"), ("kind", "throttled"))] == 2


def test_a_transition_whose_nodes_are_left_behind_is_missed(scrape, settings):
    settings.TESSERA = {**settings.TESSERA, "SCHEDULE_GRACE_SECONDS": 600}
    now = timezone.now()
    pool = NodePoolFactory(name="day-night")
    node = NodeFactory(cluster=pool.cluster, pool=pool)
    profile = SharingProfile.objects.create(name="mig", mode="mig", mig_layouts={"all": {"1g.10gb": 7}})
    schedule = Schedule.objects.create(pool=pool, name="office-hours", time_zone="UTC")
    start = (now - timedelta(hours=1)).replace(second=0, microsecond=0)
    ScheduleWindow.objects.create(
        schedule=schedule,
        name="day",
        weekdays=list(range(7)),
        start=start.time(),
        end=(start + timedelta(hours=4)).time(),
        profile=profile,
    )
    labels = (("cluster", pool.cluster.name), ("pool", "day-night"), ("schedule", "office-hours"))
    samples = scrape()
    assert samples["tessera_schedule_last_transition_timestamp_seconds"][labels] == start.timestamp()
    assert samples["tessera_schedule_transition_missed"][labels] == 0  # nothing left behind
    telemetry.drift_record(drift_of((node, "changing")), now=start + timedelta(minutes=1))
    assert scrape()["tessera_schedule_transition_missed"][labels] == 0  # being worked on
    telemetry.drift_record(drift_of((node, "planned")), now=start + timedelta(minutes=1))
    assert scrape()["tessera_schedule_transition_missed"][labels] == 1


def test_kueue_quota_drift_per_cluster_queue(scrape):
    """Each ClusterQueue of an enabled binding: how many values Tessera wrote someone else changed (0: in step)."""
    pool = NodePoolFactory(name="h100", cluster=ClusterFactory(name="east"))
    changed = [{"flavor": "tessera-h100-h100", "resource": "nvidia.com/gpu", "live": 50, "wrote": 16}]
    KueueBinding.objects.create(pool=pool, cluster_queues=["gpu", "batch"], drift={"gpu": changed})
    KueueBinding.objects.create(pool=NodePoolFactory(name="off"), cluster_queues=["gpu"], enabled=False)
    samples = scrape()["tessera_kueue_quota_drift"]
    assert one(samples, cluster="east", pool="h100", cluster_queue="gpu") == 1
    assert one(samples, cluster="east", pool="h100", cluster_queue="batch") == 0
    assert len(samples) == 2  # a disabled binding is nobody's concern
