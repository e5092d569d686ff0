"""Each console page reads the fleet with as many queries at three times the fleet as at one: the queries of bench B5
(bench/b5_pages.py), held in CI without timing."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import AuditEvent
from scheduling.models import Schedule, ScheduleWindow
from sharing.models import NodePin, PoolSharing, SharingProfile
from tests.factories import ClusterFactory, GpuFactory, MigDeviceFactory, NodeFactory, NodePoolFactory
from worker.models import NodeChange, Rollout

pytestmark = pytest.mark.django_db


def _objects() -> dict:
    """Two pools (one with a profile, one with a schedule) and a running rollout, each filled by `_grow`."""
    clusters = [ClusterFactory(driver="agent"), ClusterFactory()]
    pools = [NodePoolFactory(cluster=clusters[0]), NodePoolFactory(cluster=clusters[1])]
    profile = SharingProfile.objects.create(
        name="mig-7", mode="mig", mig_layouts={"all": {"1g.10gb": 7}}, target_products=["NVIDIA-H100-80GB-HBM3"]
    )
    night = SharingProfile.objects.create(name="time-4", mode="time_slicing", replicas=4)
    PoolSharing.objects.create(pool=pools[0], profile=profile)
    schedule = Schedule.objects.create(pool=pools[1], name="office", baseline_profile=night)
    ScheduleWindow.objects.create(
        schedule=schedule, name="day", weekdays=list(range(7)), start="08:00", end="20:00", profile=profile
    )
    rollout = Rollout.objects.create(title="t", trigger="user", actor_label="t", pool=pools[0], profile=profile)
    return {"pools": pools, "profile": profile, "schedule": schedule, "rollout": rollout}


def _grow(objects: dict, nodes: int) -> None:
    """Add `nodes` nodes across both pools: GPUs (MIG on every other node), a pin, a rollout change and an audit
    event for each."""
    for i in range(nodes):
        pool = objects["pools"][i % 2]
        node = NodeFactory(cluster=pool.cluster, pool=pool, observed_mode="mig" if i % 2 else "time_slicing")
        for index in range(2):
            gpu = GpuFactory(node=node, index=index, mig_enabled=bool(i % 2), product="NVIDIA-H100-80GB-HBM3")
            if i % 2:
                MigDeviceFactory(gpu=gpu, start=0, profile="3g.40gb", size=4)
        NodePin.objects.create(node=node, profile=objects["profile"])
        change = NodeChange.objects.create(rollout=objects["rollout"], node=node, position=node.pk, status="queued")
        for object_type, object_id in (("node", node.pk), ("nodechange", change.pk)):
            AuditEvent.objects.create(at=timezone.now(), actor_kind="system", actor_label="t", action="t",
                                      object_type=object_type, object_id=str(object_id), object_repr="t")  # fmt: skip


def _query_counts(client, urls: dict) -> dict:
    counts = {}
    for name, url in urls.items():
        client.get(url)  # once before counting: a first request may fill per-process caches
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 200, name
        counts[name] = len(captured)
    return counts


def test_every_page_reads_a_three_times_larger_fleet_with_as_many_queries(client, viewer):
    client.force_login(viewer)
    objects = _objects()
    _grow(objects, 4)
    first = objects["rollout"].changes.order_by("pk").first().node
    urls = {
        "overview": "/",
        "nodes": "/nodes/",
        "nodes page 2": "/nodes/?page=2",
        "gpus": "/gpus/",
        "clusters": "/clusters/",
        "pools": "/pools/",
        "node": f"/nodes/{first.pk}/",
        "gpu": f"/gpus/{first.gpus.first().pk}/",
        "pool": f"/pools/{objects['pools'][0].pk}/",
        "cluster": f"/clusters/{objects['pools'][0].cluster_id}/",
        "profile": f"/profiles/{objects['profile'].pk}/",
        "schedule": f"/schedules/{objects['schedule'].pk}/",
        "rollout": f"/rollouts/{objects['rollout'].pk}/",
        "audit": "/audit/",
    }
    small = _query_counts(client, urls)

    _grow(objects, 8)  # three times the fleet
    assert _query_counts(client, urls) == small
    _grow(objects, 40)  # 52 nodes: the lists (50 rows a page) get a second page
    assert _query_counts(client, urls) == small
