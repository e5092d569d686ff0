"""Which GPU stack each node runs (device plugin, or NVIDIA's DRA driver under a ClusterPolicy or a GPUCluster) and
whether DynamicMIG is on, read from what the cluster shows (sharing.dra, docs/nvidia-contracts.md §13).

Three reads per full sync: the `gpu.nvidia.com` ResourceSlices, the DRA kubelet-plugin pods (both label schemes), and
the GPUCluster singleton. A cluster that does not serve resource.k8s.io/v1 (before 1.34) or has no GPUCluster CRD
answers 404: no DRA there. Any other failure leaves every node's stored stack as it was (None)."""

import logging
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.rest import ApiException

from sharing.dra import DRIVER, HELM_PLUGIN_SELECTOR, OPERATOR_PLUGIN_SELECTOR, newest_complete, node_stack
from worker.drivers.kubernetes import api as k8s

log = logging.getLogger(__name__)
GPU_CLUSTER = ("nvidia.com", "v1alpha1", "gpuclusters", "gpu-cluster")


@dataclass
class DraView:
    """What the cluster shows of DRA: newest complete pools by node, plugin pods by node, the GPUCluster."""

    slices: dict[str, list[dict]] = field(default_factory=dict)
    plugin_pods: dict[str, dict] = field(default_factory=dict)
    gpu_cluster: dict | None = None

    def stack(self, name: str, labels: dict, allocatable: dict) -> tuple[str, bool | None]:
        return node_stack(
            labels=labels,
            allocatable=allocatable,
            slices=self.slices.get(name, []),
            plugin_pod=self.plugin_pods.get(name),
            gpu_cluster=self.gpu_cluster,
        )


def _absent(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def read_dra(api: client.ApiClient) -> DraView | None:
    """The cluster's DRA view; None when it could not be read (then the stored stacks stay)."""
    view = DraView()
    try:
        try:
            slices, _ = k8s.list_all(
                client.ResourceV1Api(api).list_resource_slice, field_selector=f"spec.driver={DRIVER}", limit=500
            )
        except ApiException as exc:
            if not _absent(exc):
                raise
            slices = []
        for (_, pool), members in newest_complete(slices).items():
            node = next((s["spec"].get("nodeName") for s in members if s["spec"].get("nodeName")), pool)
            view.slices[node] = members
        core = client.CoreV1Api(api)
        for selector in (HELM_PLUGIN_SELECTOR, OPERATOR_PLUGIN_SELECTOR):
            pods, _ = k8s.list_all(core.list_pod_for_all_namespaces, label_selector=selector, limit=500)
            for pod in pods:
                if (pod.get("spec") or {}).get("nodeName"):
                    view.plugin_pods[pod["spec"]["nodeName"]] = pod
        try:
            group, version, plural, name = GPU_CLUSTER
            view.gpu_cluster = k8s.read_json(
                client.CustomObjectsApi(api).get_cluster_custom_object, group, version, plural, name
            )
        except ApiException as exc:
            if not _absent(exc):
                raise
    except Exception as exc:
        log.warning("could not read the DRA driver's objects: %s", k8s.error_text(exc))
        return None
    return view
