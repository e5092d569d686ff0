"""GPU-holding pods from the Kubernetes API, per node (busy checks, impact previews, QoS rules)."""

from kubernetes import client

from fleet.models import Node
from fleet.observations import PodObservation
from fleet.services import pods_record
from worker.drivers.kubernetes import api as k8s
from worker.drivers.kubernetes.driver import candidate_pods
from worker.drivers.kubernetes.labels import holds_gpu, pod_gpu_resources


def _resource_requirements(resources: dict | None) -> dict:
    resources = resources or {}
    return {"requests": resources.get("requests") or {}, "limits": resources.get("limits") or {}}


def _container_resources(container: dict) -> dict:
    """A container as Kubernetes shapes it, cut to what the QoS rules read (sharing.qos.qos_class)."""
    return {"name": container.get("name", ""), "resources": _resource_requirements(container.get("resources"))}


def pod_observation(pod: dict) -> PodObservation:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)
    owner = owner or next(iter(meta.get("ownerReferences") or []), {})
    kept = {
        kind: [_container_resources(c) for c in spec.get(kind) or []]
        for kind in ("containers", "initContainers")
        if spec.get(kind)
    }
    if spec.get("resources"):  # pod-level resources decide the QoS class when set (Kubernetes 1.32+)
        kept["resources"] = _resource_requirements(spec["resources"])
    return PodObservation(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid") or f"{meta['namespace']}/{meta['name']}",
        phase=status.get("phase", ""),
        qos_class=status.get("qosClass", ""),
        priority_class=spec.get("priorityClassName", ""),
        owner_kind=owner.get("kind", ""),
        owner_name=owner.get("name", ""),
        gpu_resources=pod_gpu_resources(pod),
        spec={**kept, "tolerations": spec.get("tolerations") or []},
    )


def sync_pods(cluster) -> int:
    """Every live GPU-holding pod per node (cluster-wide lists, see candidate_pods); pods gone since are removed."""
    core = client.CoreV1Api(k8s.api_client(cluster))
    pods = candidate_pods(core, cluster.operator_namespace)
    by_node = {name: [] for name in Node.objects.live().filter(cluster=cluster).values_list("name", flat=True)}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in by_node and holds_gpu(pod, cluster.operator_namespace):
            by_node[node].append(pod_observation(pod))
    return pods_record(cluster=cluster, pods_by_node=by_node)
