"""End to end (issue 20 point 2): Kueue Workloads in the simulator become demand of the pool Tessera keeps quota
for. One Workload admitted on the pool's flavor, one pending in the pool's ClusterQueue, one in a queue no pool is
bound to and one in a queue two pools share: the worker reads them with the real client and capacity records the
first two (source `workloads`), per bucket, idempotently."""

from datetime import timedelta

import pytest

from capacity.models import DemandSample, DemandSource
from capacity.sampling import bucket
from core.audit import Actor
from fleet.models import Node, NodePool
from scheduling.kueue import kueue_binding_set
from tests.integration.test_kueue_quota_e2e import FLAVOR, GPU, GROUP, POOL_NODES, VERSION, _kueue_object
from worker.drivers.kubernetes.labels import instant
from worker.inventory.cluster import sync_cluster_full
from worker.kueue import kueue_workloads_sample, workload_clusters

pytestmark = [pytest.mark.services]


def _queue(custom, name: str, local: str, flavors: dict[str, int]) -> None:
    group = {
        "coveredResources": [GPU],
        "flavors": [{"name": f, "resources": [{"name": GPU, "nominalQuota": str(q)}]} for f, q in flavors.items()],
    }
    spec = {"namespaceSelector": {}, "resourceGroups": [group]}
    custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", _kueue_object("ClusterQueue", name, spec))
    body = _kueue_object("LocalQueue", local, {"clusterQueue": name}, "default")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "localqueues", body)


def _submit(custom, name: str, queue: str, per_pod: int, count: int) -> None:
    container = {"name": "main", "image": "busybox", "resources": {"limits": {GPU: str(per_pod)}}}
    podset = {"name": "main", "count": count, "template": {"spec": {"containers": [container]}}}
    body = _kueue_object("Workload", name, {"queueName": queue, "podSets": [podset]}, "default")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "workloads", body)


def _read(custom, name: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, "default", "workloads", name)


@pytest.mark.django_db
def test_workloads_become_demand_of_their_pool(sim, custom, sim_cluster, settings):
    settings.TESSERA = {**settings.TESSERA, "CAPACITY": {**settings.TESSERA["CAPACITY"], "SAMPLE_MINUTES": 1440}}
    cluster = sim_cluster
    sync_cluster_full(cluster)
    pool = NodePool.objects.create(cluster=cluster, name="h100")
    other = NodePool.objects.create(cluster=cluster, name="spare")
    Node.objects.filter(name__in=POOL_NODES).update(pool=pool)
    actor = Actor.system("test-admin")
    assert workload_clusters() == []  # no binding, nothing read
    kueue_binding_set(actor=actor, pool=pool, cluster_queues=["gpu", "shared"])
    kueue_binding_set(actor=actor, pool=other, cluster_queues=["shared"])
    assert workload_clusters() == [cluster.pk]

    custom.create_cluster_custom_object(
        GROUP, VERSION, "resourceflavors", _kueue_object("ResourceFlavor", FLAVOR, {"nodeLabels": {}})
    )
    custom.create_cluster_custom_object(
        GROUP, VERSION, "resourceflavors", _kueue_object("ResourceFlavor", "on-prem", {"nodeLabels": {}})
    )
    _queue(custom, "gpu", "team", {FLAVOR: 8})
    _queue(custom, "unbound", "elsewhere", {"on-prem": 8})
    _queue(custom, "shared", "both", {"on-prem": 0})
    _submit(custom, "training", "team", per_pod=2, count=2)  # 4 GPUs: admitted on Tessera's flavor
    assert sim.settle()
    _submit(custom, "waiting", "team", per_pod=8, count=1)  # 8 GPUs of 4 left: pending
    _submit(custom, "foreign", "elsewhere", per_pod=1, count=1)  # admitted on a flavor that is not Tessera's
    _submit(custom, "ambiguous", "both", per_pod=1, count=3)  # pending in a queue two pools name
    assert sim.settle()
    training, waiting = _read(custom, "training"), _read(custom, "waiting")
    assert training["status"]["admission"]["podSetAssignments"][0]["flavors"] == {GPU: FLAVOR}
    assert "admission" not in waiting.get("status", {})

    created = {name: instant(_read(custom, name)["metadata"]["creationTimestamp"]) for name in ("training", "waiting")}
    (admitted,) = [c for c in training["status"]["conditions"] if c["type"] == "Admitted"]
    admitted_at = instant(admitted["lastTransitionTime"])
    now = max(created.values()) + timedelta(days=1)  # the next day-long bucket: both arrived in the one before
    at = bucket(now)
    assert kueue_workloads_sample(cluster.pk, now=now) == 1
    assert kueue_workloads_sample(cluster.pk, now=now) == 1  # idempotent per bucket
    (row,) = DemandSample.objects.filter(source=DemandSource.WORKLOADS)
    assert (row.pool_id, row.at, row.resource) == (pool.pk, at, GPU)
    assert (row.pending, row.pending_units, row.pending_wait_max_s) == (
        1,
        8,
        int((at - created["waiting"]).total_seconds()),
    )
    assert (row.arrived, row.arrived_units) == (2, 12)
    assert (row.started, row.started_within_5min) == (1, 1)
    assert row.started_wait_s == (admitted_at - created["training"]).total_seconds()
    assert not DemandSample.objects.filter(pool=other).exists()  # the shared queue's Workload is left out

    # Admitted later: the next bucket has nothing waiting; a cluster that cannot be read keeps its rows.
    later = now + timedelta(days=1)
    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", "workloads", "waiting")
    assert kueue_workloads_sample(cluster.pk, now=later) == 1
    assert DemandSample.objects.get(source=DemandSource.WORKLOADS, at=bucket(later)).pending == 0
    cluster.kubeconfig_path = "/nonexistent/kubeconfig"
    cluster.save()
    assert isinstance(kueue_workloads_sample(cluster.pk, now=later), str)
    assert DemandSample.objects.filter(source=DemandSource.WORKLOADS).count() == 2
