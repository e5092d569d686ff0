"""A small simulated fleet per test, reached over real HTTPS with the official client (never mocked)."""

import time

import pytest
from kubernetes import client, config

from simulator import Simulator


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02):
    """Poll until predicate() returns something truthy, and return it; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)


@pytest.fixture
def sim():
    with Simulator(nodes=12, seed=7, apply_delay=0.0, workload_pods=6) as simulator:
        yield simulator


@pytest.fixture
def k8s(sim):
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        yield api


@pytest.fixture
def core(k8s):
    return client.CoreV1Api(k8s)


@pytest.fixture
def custom(k8s):
    return client.CustomObjectsApi(k8s)


def labels_of(core, node: str) -> dict:
    return core.read_node(node).metadata.labels


def mig_state(core, node: str) -> str | None:
    return labels_of(core, node).get("nvidia.com/mig.config.state")
