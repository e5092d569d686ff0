"""Beat's sample: demand, usage per namespace and team, utilisation per pool; idempotent per bucket; pruned after
DEMAND_DAYS; GPU-hours reconcile with the pool's used capacity."""

from datetime import UTC, date, datetime, timedelta

import pytest

from capacity import selectors
from capacity.models import DemandSample, DemandSource, UsageSample
from capacity.retention import capacity_prune
from capacity.sampling import WorkloadRow, bucket, sample_record, workloads_record
from fleet.models import PendingPod
from tests.factories import ClusterFactory, GpuFactory, MigDeviceFactory, NodeFactory, NodePoolFactory, PodFactory

pytestmark = pytest.mark.django_db

A100 = "NVIDIA-A100-SXM4-40GB"
NOW = datetime(2025, 3, 4, 10, 2, 30, tzinfo=UTC)
AT = datetime(2025, 3, 4, 10, 0, tzinfo=UTC)


@pytest.fixture
def pool():
    """Pool `serve`: node a (2 A100s as 3g.20gb ×2 each: 4 slices), node b (1 A100 time-sliced ×4: nvidia.com/gpu 4)."""
    cluster = ClusterFactory(name="east")
    pool = NodePoolFactory(cluster=cluster, name="serve", node_selector="pool=serve")
    a = NodeFactory(cluster=cluster, pool=pool, name="a", labels={"pool": "serve"},
                    allocatable={"nvidia.com/mig-3g.20gb": 4})  # fmt: skip
    b = NodeFactory(cluster=cluster, pool=pool, name="b", labels={"pool": "serve"}, allocatable={"nvidia.com/gpu": 4})
    for i in range(2):
        gpu = GpuFactory(node=a, index=i, product=A100, mig_enabled=True)
        for start in (0, 4):
            MigDeviceFactory(gpu=gpu, profile="3g.20gb", start=start, size=4, memory_mib=20000,
                             utilization_pct=50.0 + 10 * i, memory_used_mib=5000)  # fmt: skip
    GpuFactory(node=b, index=0, product=A100, utilization_pct=80.0, memory_used_mib=20000, memory_mib=40000)
    created, started = AT - timedelta(minutes=4), AT - timedelta(minutes=2)
    PodFactory(node=a, namespace="ml", labels={"team": "vision"}, gpu_resources={"nvidia.com/mig-3g.20gb": 2},
               created_at=created, scheduled_at=started)  # fmt: skip
    PodFactory(node=a, namespace="ml", labels={"team": "speech"}, gpu_resources={"nvidia.com/mig-3g.20gb": 1},
               created_at=AT - timedelta(hours=1), scheduled_at=AT - timedelta(minutes=50))  # fmt: skip
    PodFactory(node=b, namespace="batch", labels={}, gpu_resources={"nvidia.com/gpu": 2},
               created_at=AT - timedelta(minutes=3), scheduled_at=AT - timedelta(seconds=30))  # fmt: skip
    for i, waited in enumerate((timedelta(minutes=3), timedelta(minutes=40))):
        PendingPod.objects.create(cluster=cluster, namespace="ml", name=f"wait-{i}", uid=f"w{i}",
                                  gpu_resources={"nvidia.com/mig-3g.20gb": 1}, node_selector={"pool": "serve"},
                                  created_at=AT - waited, observed_at=NOW)  # fmt: skip
    return pool


def test_a_sample_records_capacity_use_waiting_and_utilisation_per_resource(pool):
    sample_record(now=NOW)
    rows = {r.resource: r for r in DemandSample.objects.filter(pool=pool, at=AT)}
    slices, whole = rows["nvidia.com/mig-3g.20gb"], rows["nvidia.com/gpu"]
    assert (slices.capacity, slices.used, slices.pending, slices.pending_units) == (4, 3, 2, 2)
    assert slices.pending_wait_max_s == 40 * 60
    assert (slices.arrived, slices.started, slices.started_within_5min) == (2, 1, 1)  # the vision pod and wait-0
    assert slices.used_gpus == pytest.approx(3 * 3 / 7)
    assert slices.utilization_pct == pytest.approx(55.0) and slices.memory_used_pct == pytest.approx(25.0)
    assert (whole.capacity, whole.used, whole.used_gpus, whole.gpu_share) == (4, 2, 0.5, 0.25)  # time-sliced ×4
    assert whole.utilization_pct == 80.0 and whole.memory_used_pct == 50.0
    usage = {(u.namespace, u.team, u.resource): (u.units, round(u.gpus, 4)) for u in UsageSample.objects.all()}
    assert usage == {
        ("ml", "vision", "nvidia.com/mig-3g.20gb"): (2, round(6 / 7, 4)),
        ("ml", "speech", "nvidia.com/mig-3g.20gb"): (1, round(3 / 7, 4)),
        ("batch", "", "nvidia.com/gpu"): (2, 0.5),
    }


def test_sampling_a_bucket_again_replaces_it(pool):
    sample_record(now=NOW)
    first = DemandSample.objects.count(), UsageSample.objects.count()
    sample_record(now=NOW + timedelta(minutes=2))  # the same 5-minute bucket
    assert (DemandSample.objects.count(), UsageSample.objects.count()) == first
    assert bucket(NOW) == AT
    sample_record(now=NOW + timedelta(minutes=5))
    assert DemandSample.objects.count() == 2 * first[0]


def test_kueue_workloads_are_demand_of_their_own_source(pool):
    sample_record(now=NOW)
    rows = [
        WorkloadRow(pool.pk, "ml", "train-1", {"nvidia.com/gpu": 8}, AT - timedelta(minutes=1), None),
        WorkloadRow(
            pool.pk, "ml", "train-2", {"nvidia.com/gpu": 4}, AT - timedelta(hours=2), AT - timedelta(minutes=3)
        ),
    ]
    assert workloads_record(rows, now=NOW) == 1
    assert workloads_record(rows, now=NOW) == 1  # idempotent
    workload = DemandSample.objects.get(source=DemandSource.WORKLOADS)
    assert (workload.pending, workload.pending_units, workload.arrived, workload.started) == (1, 8, 1, 1)
    assert workload.started_within_5min == 0  # admitted after 2 hours
    week = selectors.week_demand(pool, AT + timedelta(minutes=5))
    assert week[AT]["nvidia.com/gpu"]["pending_units"] == 8  # both sources summed
    assert week[AT]["nvidia.com/gpu"]["capacity"] == 4


def test_gpu_hours_per_team_reconcile_with_the_pools_used_capacity(pool):
    for minutes in range(0, 60, 5):
        sample_record(now=AT + timedelta(minutes=minutes))
    day = date(2025, 3, 4)
    by_team = selectors.gpu_hours(start=day, end=day, group_by="team", pool=pool)
    assert {(r["group"], r["resource"]): r["gpu_hours"] for r in by_team} == {
        ("", "nvidia.com/gpu"): 0.5,
        ("speech", "nvidia.com/mig-3g.20gb"): round(3 / 7, 4),
        ("vision", "nvidia.com/mig-3g.20gb"): round(6 / 7, 4),
    }
    check = selectors.reconciliation(by_team, start=day, end=day, pool=pool)
    assert check["difference_gpu_hours"] == pytest.approx(0, abs=1e-3)
    assert check["pool_used_gpu_hours"] == pytest.approx(0.5 + 9 / 7, abs=1e-3)
    by_namespace = selectors.gpu_hours(start=day, end=day, group_by="namespace", pool=pool)
    assert sum(r["gpu_hours"] for r in by_namespace) == pytest.approx(check["pool_used_gpu_hours"], abs=1e-3)
    assert "5 minutes" in check["statement"]


def test_samples_older_than_the_retention_go(pool, settings):
    sample_record(now=NOW)
    sample_record(now=NOW - timedelta(days=36))
    assert capacity_prune(now=NOW) == {"demand_samples": 2, "usage_samples": 3}
    assert set(DemandSample.objects.values_list("at", flat=True)) == {AT}
