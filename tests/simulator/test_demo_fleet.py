"""The fleet `make run` starts (seed 7, 60 nodes) shows the newest parts of the MIG catalog sliced: a new user finds a
Grace Hopper node with its MIG layout drawn, as GFD and the MIG Manager report it."""

from kubernetes import client, config

from simulator import Simulator


def test_the_demo_fleet_has_a_gh200_node_running_mig():
    with (
        Simulator(nodes=60, seed=7, apply_delay=0.0, workload_pods=0) as sim,
        config.new_client_from_config(config_file=sim.kubeconfig_path) as api,
    ):
        node = client.CoreV1Api(api).read_node("gpu-node-0029")
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.product"].startswith("NVIDIA-GH200-480GB")
    assert (labels["nvidia.com/mig.config"], labels["nvidia.com/mig.config.state"]) == ("all-balanced", "success")
    assert any(k.startswith("nvidia.com/mig-") for k in node.status.allocatable)
