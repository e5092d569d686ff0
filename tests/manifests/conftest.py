"""A small fleet with one object of every kind, made through the services as the UI makes them."""

from datetime import time

import pytest

from core.audit import Actor
from scheduling import kueue, services
from sharing import services as sharing_services
from sharing.models import PoolSharing
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory

H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


@pytest.fixture
def world(actor):
    """Cluster `east`, pool `inference` (2 nodes of 2 whole H100s, one pod on a GPU), profiles `whole` (its default)
    and `mig-7`, QoS policy `serving`, a schedule whose window runs `mig-7` on weekday mornings, a Kueue binding."""
    cluster = ClusterFactory(name="east")
    pool = NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference")
    for i in range(2):
        node = NodeFactory(
            cluster=cluster,
            pool=pool,
            name=f"inf-{i}",
            labels={"tessera.io/pool": "inference", "nvidia.com/gpu.product": H100},
            allocatable={"nvidia.com/gpu": 2},
        )
        for index in range(2):
            GpuFactory(node=node, index=index, mig_enabled=False)
    mig = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    whole = sharing_services.profile_create(
        actor=actor, name="whole", mode="passthrough", target_products=[H100], description="Whole GPUs."
    )
    policy = sharing_services.qos_policy_create(actor=actor, name="serving", required_qos="guaranteed")
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=whole)
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    services.schedule_create(
        actor=actor,
        pool=pool,
        name="mornings",
        time_zone="Europe/Berlin",
        windows=[{"name": "am", "weekdays": [0, 1, 2, 3, 4], "start": time(6), "end": time(9), "profile": mig}],
        exceptions=[{"date": "2026-12-25", "note": "Christmas"}],
    )
    kueue.kueue_binding_set(actor=actor, pool=pool, cluster_queues=["team-a"])
    assert PoolSharing.objects.get(pool=pool).profile == whole
    return pool
