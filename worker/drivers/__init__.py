"""Drivers carry changes to nodes and read back what the nodes did: `kubernetes` (GPU Operator) or `agent`."""

from worker.drivers.agent import AgentDriver
from worker.drivers.base import Driver
from worker.drivers.kubernetes import kubernetes_driver


def driver_for(cluster) -> Driver:
    """The driver of a cluster; Kubernetes drivers are cached per cluster (one API client each)."""
    if cluster.driver == "agent":
        return AgentDriver(cluster)
    return kubernetes_driver(cluster)
