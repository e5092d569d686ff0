"""Bounded state, the fleet's part: each rule deletes what is older than its setting and keeps what is newer."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import AgentCredential, Gpu, GpuEvent, MigDevice, Node, PendingAgent, Pod
from fleet.retention import fleet_prune
from fleet.tasks import retention_prune
from sharing.models import NodePin, SharingProfile
from tests.factories import GpuFactory, MigDeviceFactory, NodeFactory, PodFactory
from worker.models import NodeChange, Rollout

pytestmark = pytest.mark.django_db
NOW = timezone.now()
DAY = timedelta(days=1)


def _events(gpu, *ages: timedelta):
    GpuEvent.objects.bulk_create(GpuEvent(gpu=gpu, at=NOW - age, kind="xid", code=13) for age in ages)


def test_gpu_events_older_than_the_setting_go():
    gpu = GpuFactory()
    _events(gpu, 91 * DAY, 89 * DAY, timedelta(0))
    assert fleet_prune(now=NOW)["gpu_events"] == 1
    assert sorted(GpuEvent.objects.values_list("at", flat=True)) == [NOW - 89 * DAY, NOW]


def test_a_gpu_keeps_its_newest_events_up_to_the_cap(settings):
    settings.TESSERA = {**settings.TESSERA, "RETENTION": {**settings.TESSERA["RETENTION"], "GPU_EVENTS_PER_GPU": 3}}
    storm, calm = GpuFactory(), GpuFactory()
    _events(storm, *(timedelta(minutes=m) for m in range(7)))
    _events(calm, *(timedelta(minutes=m) for m in range(3)))
    assert fleet_prune(now=NOW)["gpu_events_over_cap"] == 4
    kept = GpuEvent.objects.filter(gpu=storm).values_list("at", flat=True)
    assert sorted(kept) == [NOW - timedelta(minutes=m) for m in (2, 1, 0)]
    assert GpuEvent.objects.filter(gpu=calm).count() == 3


def test_nodes_gone_long_ago_go_with_their_gpus_pods_credentials_and_pin():
    gone = NodeFactory(gone_at=NOW - 31 * DAY)
    gpu = GpuFactory(node=gone)
    MigDeviceFactory(gpu=gpu)
    _events(gpu, DAY)
    PodFactory(node=gone)
    AgentCredential.objects.create(node=gone, key_id="k-gone", secret_hash="x")
    profile = SharingProfile.objects.create(name="p", mode="passthrough")
    NodePin.objects.create(node=gone, profile=profile)
    recent, live = NodeFactory(gone_at=NOW - 29 * DAY), NodeFactory()

    assert fleet_prune(now=NOW)["nodes"] == 1

    assert set(Node.objects.all()) == {recent, live}
    for model in (Gpu, MigDevice, GpuEvent, AgentCredential, NodePin):
        assert not model.objects.exists(), model


def test_a_gone_node_a_kept_rollout_names_stays_until_that_rollout_goes():
    gone = NodeFactory(gone_at=NOW - 365 * DAY)
    rollout = Rollout.objects.create(title="t", trigger="user", actor_label="t", status="running")
    NodeChange.objects.create(rollout=rollout, node=gone, position=0, status="queued")
    assert fleet_prune(now=NOW)["nodes"] == 0
    rollout.delete()
    assert fleet_prune(now=NOW)["nodes"] == 1
    assert not Node.objects.exists()


def test_gpus_gone_long_ago_go_from_live_nodes():
    node = NodeFactory()
    old, recent, live = (GpuFactory(node=node, gone_at=t) for t in (NOW - 31 * DAY, NOW - DAY, None))
    assert fleet_prune(now=NOW)["gpus"] == 1
    assert set(Gpu.objects.all()) == {recent, live}
    assert old.pk not in Gpu.objects.values_list("pk", flat=True)


def test_pods_of_gone_nodes_go_at_once():
    gone, live = NodeFactory(gone_at=NOW - timedelta(minutes=5)), NodeFactory()
    PodFactory(node=gone)
    kept = PodFactory(node=live)
    assert fleet_prune(now=NOW)["pods_of_gone_nodes"] == 1
    assert list(Pod.objects.all()) == [kept]
    assert Node.objects.count() == 2  # the node itself waits for GONE_DAYS


def test_revoked_credentials_go_after_the_setting_active_ones_stay():
    node = NodeFactory()
    for key_id, revoked in (("old", NOW - 31 * DAY), ("recent", NOW - DAY), ("active", None)):
        AgentCredential.objects.create(node=node, key_id=key_id, secret_hash="x", revoked_at=revoked)
    assert fleet_prune(now=NOW)["revoked_credentials"] == 1
    assert set(AgentCredential.objects.values_list("key_id", flat=True)) == {"recent", "active"}


def test_pending_agents_past_their_ttl_go_decided_ones_stay(settings):
    settings.TESSERA = {**settings.TESSERA, "PENDING_AGENT_TTL_HOURS": 24}
    node = NodeFactory()
    for key, status, age in (("expired", "pending", 25), ("waiting", "pending", 23), ("rejected", "rejected", 25)):
        at = NOW - timedelta(hours=age)
        PendingAgent.objects.create(node=node, key_hash=key, status=status, requested_at=at, last_asked_at=NOW)
    assert fleet_prune(now=NOW)["expired_pending_agents"] == 1
    assert set(PendingAgent.objects.values_list("key_hash", flat=True)) == {"waiting", "rejected"}


def test_the_task_prunes_and_a_second_run_finds_nothing():
    _events(GpuFactory(), 100 * DAY)
    first = retention_prune.delay().get()
    assert first["gpu_events"] == 1
    assert not any(retention_prune.delay().get().values())
