"""Kubernetes driver package: the driver, its API plumbing and the GPU Operator's ClusterPolicy/ConfigMaps."""

from worker.drivers.kubernetes.driver import KubernetesDriver

__all__ = ["KubernetesDriver", "kubernetes_driver"]


def kubernetes_driver(cluster) -> KubernetesDriver:
    """A driver over the cluster's cached ApiClient (the client is the expensive part, so drivers are cheap)."""
    return KubernetesDriver(cluster)
