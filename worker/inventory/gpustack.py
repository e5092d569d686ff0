"""Which GPU stack each node runs (device plugin, or NVIDIA's DRA driver under a ClusterPolicy or a GPUCluster) and
whether DynamicMIG is on, read from what the cluster shows (sharing.dra, docs/nvidia-contracts.md §13).

Three reads per full sync: the `gpu.nvidia.com` ResourceSlices, the DRA kubelet-plugin pods (both label schemes), and
the GPUCluster singleton. A cluster that does not serve resource.k8s.io/v1 (before 1.34) or has no GPUCluster CRD
answers 404: no DRA there. Any other failure leaves every node's stored stack as it was (None)."""

import logging
from dataclasses import dataclass, field, replace

from kubernetes import client
from kubernetes.client.rest import ApiException

from fleet.observations import GpuObservation, MigDeviceObservation
from sharing.dra import (
    DRIVER,
    HELM_PLUGIN_SELECTOR,
    OPERATOR_PLUGIN_SELECTOR,
    device_key,
    newest_complete,
    node_stack,
    pool_gpus,
)
from sharing.mig import UnknownProductError, get_product
from sharing.mig.catalog import gfd_product_name
from worker.drivers.kubernetes import api as k8s

log = logging.getLogger(__name__)
GPU_CLUSTER = ("nvidia.com", "v1alpha1", "gpuclusters", "gpu-cluster")


@dataclass
class DraView:
    """What the cluster shows of DRA: every `gpu.nvidia.com` slice by name (and the list's resourceVersion, where a
    watch resumes), the newest complete pool by node, plugin pods by node, the GPUCluster."""

    raw: dict[str, dict] = field(default_factory=dict)
    version: str = ""
    slices: dict[str, list[dict]] = field(default_factory=dict)
    plugin_pods: dict[str, dict] = field(default_factory=dict)
    gpu_cluster: dict | None = None

    def load(self, slices: list[dict], version: str) -> None:
        self.raw = {s["metadata"]["name"]: s for s in slices}
        self.version = version
        self.slices = {}
        for (_, pool), members in newest_complete(slices).items():
            self.slices[_node_of(members, pool)] = members

    def apply(self, kind: str, obj: dict) -> str | None:
        """A watch event of a slice; returns the node whose pool it changed (None for another driver)."""
        if (obj.get("spec") or {}).get("driver") != DRIVER:
            return None
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.raw.pop(name, None)
        else:
            self.raw[name] = obj
        pool = (obj["spec"].get("pool") or {}).get("name", "")
        node = obj["spec"].get("nodeName") or pool
        members = [s for s in self.raw.values() if (s["spec"].get("pool") or {}).get("name") == pool]
        newest = newest_complete(members).get((DRIVER, pool))
        if newest is None:
            self.slices.pop(node, None)  # incomplete or gone: nothing to read until the generation is whole
        else:
            self.slices[node] = newest
        return node

    def stack(self, name: str, labels: dict, allocatable: dict) -> tuple[str, bool | None]:
        return node_stack(
            labels=labels,
            allocatable=allocatable,
            slices=self.slices.get(name, []),
            plugin_pod=self.plugin_pods.get(name),
            gpu_cluster=self.gpu_cluster,
        )


def _node_of(members: list[dict], pool: str) -> str:
    return next((s["spec"].get("nodeName") for s in members if s["spec"].get("nodeName")), pool)


def _absent(exc: Exception) -> bool:
    return isinstance(exc, ApiException) and exc.status == 404


def read_dra(api: client.ApiClient) -> DraView | None:
    """The cluster's DRA view; None when it could not be read (then the stored stacks stay)."""
    view = DraView()
    try:
        try:
            slices, version = k8s.list_all(
                client.ResourceV1Api(api).list_resource_slice, field_selector=f"spec.driver={DRIVER}", limit=500
            )
        except ApiException as exc:
            if not _absent(exc):
                raise
            slices, version = [], ""
        view.load(slices, version)
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


def pool_observations(pool: str, slices: list[dict], exported=None) -> tuple[GpuObservation, ...]:
    """A DRA node's GPUs and MIG devices from its pool's newest complete generation (sharing.dra.pool_gpus), keyed
    by driver/pool/device; the catalog product from the `productName` attribute. `exported` (dcgm-exporter's
    observations of the node, when scraped) lends each GPU its index and health, matched by UUID."""
    by_uuid = {g.uuid: g for g in exported or ()}
    gpus = []
    for found in pool_gpus(slices):
        try:
            product = get_product(found.product_name)
        except UnknownProductError:
            product = None
        seen = by_uuid.get(found.uuid)
        migs = tuple(
            MigDeviceObservation(
                profile=m.profile,
                start=m.start,
                size=m.size,
                uuid=m.uuid,
                memory_mib=m.memory_mib,
                dra_device=device_key(pool, m.device),
            )
            for m in found.migs
        )
        gpus.append(
            GpuObservation(
                index=seen.index if seen else found.minor,
                uuid=found.uuid,
                product=(product.name if product else gfd_product_name(found.product_name))[:100],
                memory_mib=found.memory_mib or (product.memory_mib if product else 0),
                pci_bus_id=found.pci_bus_id,
                pci_device_id=product.pci_device_id if product else "",
                mig_capable=bool(product and product.mig_capable),
                mig_enabled=bool(found.migs),
                health=seen.health if seen else "unknown",
                mig_devices=migs,
                dra_device=device_key(pool, found.device) if found.device else "",
            )
        )
    return tuple(gpus)


def leave_dra_devices(gpus: tuple[GpuObservation, ...]) -> tuple[GpuObservation, ...]:
    """dcgm-exporter's view of a DRA node's GPUs for the metrics scrape: its MIG devices and DRA keys are left as
    the ResourceSlices gave them."""
    return tuple(replace(g, mig_devices=None, dra_device=None) for g in gpus)
