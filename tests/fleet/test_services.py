"""Inventory recording is idempotent and bulk; clusters and pools follow their rules."""

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import IntegrityError
from django.utils import timezone

from core.audit import Actor
from core.exceptions import ApplicationError
from fleet import services
from fleet.models import Gpu, MigDevice, Node
from fleet.observations import GpuMetrics, GpuObservation, MigDeviceObservation, NodeObservation
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db
ACTOR = Actor.system("test")


def _gpu(index, uuid, mig=None):
    return GpuObservation(
        index=index,
        uuid=uuid,
        product="NVIDIA-H100-80GB-HBM3",
        memory_mib=81559,
        mig_capable=True,
        mig_enabled=mig is not None,
        health="healthy",
        mig_devices=mig,
    )


def _node(name="n1", gpus=None, **kw):
    gpus = gpus if gpus is not None else (_gpu(0, "GPU-a"), _gpu(1, "GPU-b"))
    return NodeObservation(name=name, labels={"tessera.io/pool": "inf"}, ready=True, gpus=gpus, **kw)


def test_record_creates_nodes_gpus_and_mig_devices():
    cluster = ClusterFactory()
    mig = (MigDeviceObservation("3g.40gb", 0, 4, uuid="MIG-1"), MigDeviceObservation("3g.40gb", 4, 4, uuid="MIG-2"))
    result = services.inventory_record(cluster=cluster, nodes=[_node(gpus=(_gpu(0, "GPU-a", mig), _gpu(1, "GPU-b")))])
    assert (result.nodes_created, result.gpus_created, result.mig_devices_replaced) == (1, 2, 1)
    node = Node.objects.get(name="n1")
    assert node.gpus.count() == 2
    assert list(MigDevice.objects.filter(gpu__uuid="GPU-a").values_list("profile", "start")) == [
        ("3g.40gb", 0),
        ("3g.40gb", 4),
    ]


def test_same_report_twice_changes_nothing_but_last_seen(django_assert_max_num_queries):
    cluster = ClusterFactory()
    mig = (MigDeviceObservation("1g.10gb", 0, 1, uuid="MIG-1"),)
    report = [_node(gpus=(_gpu(0, "GPU-a", mig), _gpu(1, "GPU-b")))]
    t0 = timezone.now() - timedelta(minutes=5)
    services.inventory_record(cluster=cluster, nodes=report, now=t0)
    node = Node.objects.get()
    updated_at = node.updated_at
    gpu_updated = dict(Gpu.objects.values_list("uuid", "updated_at"))
    mig_ids = list(MigDevice.objects.values_list("pk", flat=True))

    later = timezone.now()
    result = services.inventory_record(cluster=cluster, nodes=report, now=later)

    assert not result.changed
    node.refresh_from_db()
    assert node.updated_at == updated_at
    assert node.last_seen_at == later
    assert dict(Gpu.objects.values_list("uuid", "updated_at")) == gpu_updated
    assert list(MigDevice.objects.values_list("pk", flat=True)) == mig_ids


def test_record_is_bulk_query_count_independent_of_fleet_size(django_assert_max_num_queries):
    cluster = ClusterFactory()
    small = [_node(f"n{i}", gpus=(_gpu(0, f"GPU-{i}-0"),)) for i in range(3)]
    big = [_node(f"m{i}", gpus=tuple(_gpu(g, f"GPU-m{i}-{g}") for g in range(8))) for i in range(60)]
    with django_assert_max_num_queries(14):
        services.inventory_record(cluster=cluster, nodes=small)
    # Bulk, not per row: SQLite caps bound parameters, so 480 GPU rows take ~12 INSERT batches there.
    with django_assert_max_num_queries(28):
        services.inventory_record(cluster=cluster, nodes=big)
    assert Gpu.objects.count() == 3 + 480


def test_gpu_that_disappears_is_marked_gone_and_keeps_history():
    cluster = ClusterFactory()
    services.inventory_record(cluster=cluster, nodes=[_node()])
    services.inventory_record(cluster=cluster, nodes=[_node(gpus=(_gpu(0, "GPU-a"),))])
    gone = Gpu.objects.get(uuid="GPU-b")
    assert gone.gone_at is not None
    assert Gpu.objects.live().count() == 1

    # A replacement GPU at the same index is a new row; the old one stays gone.
    result = services.inventory_record(cluster=cluster, nodes=[_node(gpus=(_gpu(0, "GPU-a"), _gpu(1, "GPU-c")))])
    assert result.gpus_created == 1
    assert Gpu.objects.get(uuid="GPU-b").gone_at is not None
    assert set(Gpu.objects.live().values_list("uuid", flat=True)) == {"GPU-a", "GPU-c"}


def test_gpu_that_returns_is_live_again():
    cluster = ClusterFactory()
    services.inventory_record(cluster=cluster, nodes=[_node()])
    services.inventory_record(cluster=cluster, nodes=[_node(gpus=(_gpu(0, "GPU-a"),))])
    services.inventory_record(cluster=cluster, nodes=[_node()])
    assert Gpu.objects.get(uuid="GPU-b").gone_at is None


def test_complete_report_marks_missing_nodes_gone():
    cluster = ClusterFactory()
    services.inventory_record(cluster=cluster, nodes=[_node("n1"), _node("n2", gpus=())], complete=True)
    result = services.inventory_record(cluster=cluster, nodes=[_node("n1")], complete=True)
    assert result.nodes_gone == 1
    assert Node.objects.get(name="n2").gone_at is not None
    assert list(Node.objects.live().values_list("name", flat=True)) == ["n1"]


def test_report_without_gpus_leaves_gpus_alone():
    cluster = ClusterFactory()
    services.inventory_record(cluster=cluster, nodes=[_node()])
    services.inventory_record(cluster=cluster, nodes=[replace(_node(), gpus=None, unschedulable=True)])
    assert Gpu.objects.live().count() == 2
    assert Node.objects.get().unschedulable is True


def test_config_state_change_records_since():
    cluster = ClusterFactory()
    t0 = timezone.now() - timedelta(minutes=10)
    services.inventory_record(cluster=cluster, nodes=[_node(config_state="success")], now=t0)
    t1 = timezone.now()
    services.inventory_record(cluster=cluster, nodes=[_node(config_state="pending")], now=t1)
    node = Node.objects.get()
    assert (node.config_state, node.config_state_since) == ("pending", t1)


def test_selector_pool_membership_follows_labels():
    cluster = ClusterFactory()
    pool = NodePoolFactory(cluster=cluster, node_selector="tessera.io/pool=inf")
    services.inventory_record(cluster=cluster, nodes=[_node("n1")])
    assert Node.objects.get(name="n1").pool == pool
    relabelled = replace(_node("n1"), labels={"tessera.io/pool": "train"})
    services.inventory_record(cluster=cluster, nodes=[relabelled])
    assert Node.objects.get(name="n1").pool is None


def test_pool_set_members_checks_cluster_and_selector():
    pool = NodePoolFactory()
    own = NodeFactory(cluster=pool.cluster)
    other = NodeFactory()
    with pytest.raises(ApplicationError) as err:
        services.pool_set_members(actor=ACTOR, pool=pool, nodes=[own, other])
    assert "nodes" in err.value.errors
    assert services.pool_set_members(actor=ACTOR, pool=pool, nodes=[own]) == 1
    assert list(pool.nodes.all()) == [own]

    selector_pool = NodePoolFactory(cluster=pool.cluster, node_selector="a=b")
    with pytest.raises(ApplicationError):
        services.pool_set_members(actor=ACTOR, pool=selector_pool, nodes=[own])


def test_pool_with_selector_assigns_members_through_task(django_capture_on_commit_callbacks):
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster, labels={"role": "infer"})
    NodeFactory(cluster=cluster, labels={"role": "train"})
    with django_capture_on_commit_callbacks(execute=True):
        pool = services.pool_create(actor=ACTOR, cluster=cluster, name="infer", node_selector="role in (infer, serve)")
    assert list(pool.nodes.all()) == [node]


def test_bad_selector_is_a_field_error():
    with pytest.raises(ApplicationError) as err:
        services.pool_create(actor=ACTOR, cluster=ClusterFactory(), name="p", node_selector="a in b")
    assert "node_selector" in err.value.errors


def test_cluster_needs_credentials_and_cannot_be_deleted_with_nodes():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        services.cluster_create(actor=ACTOR, name="c", driver="kubernetes")
    cluster = services.cluster_create(actor=ACTOR, name="c", driver="kubernetes", in_cluster=True)
    NodeFactory(cluster=cluster)
    with pytest.raises(ApplicationError) as err:
        services.cluster_delete(actor=ACTOR, cluster=cluster)
    assert err.value.status == 409


def test_metrics_record_derives_health():
    ok, xid, ecc = GpuFactory(), GpuFactory(), GpuFactory()
    services.gpu_metrics_record(
        samples=[
            GpuMetrics(uuid=ok.uuid, utilization_pct=50.0, temperature_c=60.0),
            GpuMetrics(uuid=xid.uuid, last_xid=79),
            GpuMetrics(uuid=ecc.uuid, ecc_dbe_total=2),
            GpuMetrics(uuid="GPU-unknown", utilization_pct=1.0),
        ]
    )
    health = dict(Gpu.objects.values_list("uuid", "health"))
    assert health == {ok.uuid: "healthy", xid.uuid: "unhealthy", ecc.uuid: "unhealthy"}
    assert Gpu.objects.get(uuid=ok.uuid).utilization_pct == 50.0


def test_database_constraints_hold():
    gpu = GpuFactory(index=0)
    with pytest.raises(IntegrityError):
        GpuFactory(node=gpu.node, index=0)


def test_stale_nodes():
    fresh = NodeFactory()
    old = NodeFactory(last_seen_at=timezone.now() - timedelta(hours=1))
    assert list(Node.objects.stale()) == [old]
    assert list(Node.objects.fresh()) == [fresh]


def test_gone_node_takes_its_gpus_with_it():
    cluster = ClusterFactory()
    services.inventory_record(
        cluster=cluster, nodes=[_node("n1"), _node("n2", gpus=(_gpu(0, "GPU-z"),))], complete=True
    )
    services.inventory_record(cluster=cluster, nodes=[_node("n1")], complete=True)
    assert Gpu.objects.get(uuid="GPU-z").gone_at is not None
    assert Gpu.objects.live().count() == 2
