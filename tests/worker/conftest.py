"""Fixtures of the worker tests: an agent pool whose nodes the engine drives from simulated agent reports."""

import pytest

from core.audit import Actor
from fleet import services as fleet_services
from fleet.models import Node
from sharing import services as sharing_services
from tests.factories import ClusterFactory, NodePoolFactory
from tests.worker.test_engine import H100, _observation


def mig_pool(admin_user, nodes: int):
    """An agent cluster with a pool of `nodes` nodes running passthrough, and a MIG profile assigned to the pool."""
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster)
    fleet_services.inventory_record(
        cluster=cluster, nodes=[_observation(f"n{i}", mig_config="all-disabled", dp="whole") for i in range(nodes)]
    )
    Node.objects.update(pool=pool)
    actor = Actor.for_user(admin_user)
    profile = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    return cluster, pool, profile


@pytest.fixture
def fleet(admin_user):
    """Five such nodes."""
    return mig_pool(admin_user, 5)
