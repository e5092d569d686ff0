"""The DRA twin of test_rollout_faults.test_profile_rolls_out_to_every_node (issue 26 point 4): the same profile
rolled out by the engine with the real Kubernetes driver to a pool of nodes served by NVIDIA's DRA driver. MIG
Manager changes the layout, the driver restarts each node's gpu.nvidia.com kubelet plugin (it discovers MIG devices
only at start), and a change is verified only once the node's pool shows exactly the expected devices."""

import pytest

from sharing.dra import newest_complete, pool_resources
from simulator.resources import RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES
from tests.integration.test_rollout_faults import POOL_NODES, _fleet, drive, start_rollout
from worker.drivers import driver_for

pytestmark = [pytest.mark.services, pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")]


NODE, GPU_CLASS = "gpu-node-0002", "gpu.nvidia.com"  # an idle H100, whole GPUs at start


@pytest.fixture
def sim_options():
    return {"dra_nodes": "all"}


def pool_of(sim, node: str) -> dict[str, int]:
    pools = newest_complete(sim.store.objects(RESOURCE_SLICES))
    return pool_resources(pools.get(("gpu.nvidia.com", node), []))


@pytest.mark.django_db
def test_a_mig_profile_rolls_out_to_dra_nodes_through_a_plugin_restart(sim, core, sim_cluster):
    _fleet(sim, core, sim_cluster)
    before = {n: sim.dra.plugin_starts[n] for n in POOL_NODES}
    changing = [n for n in POOL_NODES if pool_of(sim, n) != {"nvidia.com/mig-1g.10gb": 56}]
    assert changing, "the seed has H100 nodes off the profile's layout"
    rollout = start_rollout(canary_count=1, batch_size=2)
    assert drive(rollout, sim).status == "succeeded"
    for name in POOL_NODES:
        assert pool_of(sim, name) == {"nvidia.com/mig-1g.10gb": 56}
        node = core.read_node(name)
        assert not {k for k in node.status.allocatable if k.startswith("nvidia.com/")}  # DRA: no extended resource
    for name in changing:  # each changed node's plugin restarted once after MIG Manager's success
        assert sim.dra.plugin_starts[name] == before[name] + 1


@pytest.mark.django_db
def test_pods_holding_claims_on_a_dra_node_are_busy_pods_the_busy_policy_drains(sim, sim_cluster):
    sim.store.create(
        RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "a-gpu", "namespace": "research"},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
            },
        },
    )
    sim.add_dra_pod("research", "claims-only", claims=[{"name": "g", "resourceClaimTemplateName": "a-gpu"}], node=NODE)
    busy = driver_for(sim_cluster).busy_pods([NODE, "gpu-node-0005"])
    assert [(p.namespace, p.name) for p in busy[NODE]] == [("research", "claims-only")]
    assert "gpu-node-0005" not in busy
