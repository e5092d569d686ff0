"""GPU-holding pods from the Kubernetes API, per node (busy checks, impact previews, QoS rules, GPU-hours), and the
pods that ask for GPUs and wait for a node (demand, capacity/)."""

from dataclasses import replace
from datetime import datetime

from kubernetes import client
from kubernetes.client.rest import ApiException

from fleet.models import Gpu, MigDevice, Node
from fleet.observations import PendingPodObservation, PodObservation
from fleet.services import pending_pods_record, pods_record
from sharing.dra import claim_holdings, requested_resources
from worker.drivers.kubernetes import api as k8s
from worker.drivers.kubernetes.driver import candidate_pods
from worker.drivers.kubernetes.labels import holds_gpu, instant, pod_gpu_resources


def _resource_requirements(resources: dict | None) -> dict:
    resources = resources or {}
    return {"requests": resources.get("requests") or {}, "limits": resources.get("limits") or {}}


def _container_resources(container: dict) -> dict:
    """A container as Kubernetes shapes it, cut to what the QoS rules read (sharing.qos.qos_class)."""
    return {"name": container.get("name", ""), "resources": _resource_requirements(container.get("resources"))}


def _scheduled_at(status: dict) -> datetime | None:
    condition = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    return instant(condition.get("lastTransitionTime")) if condition and condition.get("status") == "True" else None


def pending_observation(pod: dict, claimed: dict | None = None) -> PendingPodObservation | None:
    """A pod no node took yet that asks for GPU resources (in its containers, or `claimed` through ResourceClaims);
    None for any other pod."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    created = instant(meta.get("creationTimestamp"))
    resources = {**(claimed or {}), **pod_gpu_resources(pod)}
    if spec.get("nodeName") or status.get("phase", "Pending") != "Pending" or not resources or created is None:
        return None
    return PendingPodObservation(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid") or f"{meta['namespace']}/{meta['name']}",
        gpu_resources=resources,
        created_at=created,
        labels=meta.get("labels") or {},
        node_selector=spec.get("nodeSelector") or {},
    )


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
        labels=meta.get("labels") or {},
        created_at=instant(meta.get("creationTimestamp")),
        scheduled_at=_scheduled_at(status),
    )


def claim_resources(api, cluster) -> dict[str, dict[str, int]]:
    """Pod uid -> the GPU resources its allocated `gpu.nvidia.com` claims hold, by the DRA devices the inventory
    stored (Gpu/MigDevice.dra_device). A cluster without resource.k8s.io/v1 (404) has none."""
    resource_of = {
        key: "nvidia.com/gpu"
        for key in Gpu.objects.live()
        .filter(node__cluster=cluster)
        .exclude(dra_device="")
        .values_list("dra_device", flat=True)
    }
    devices = MigDevice.objects.filter(gpu__node__cluster=cluster, gpu__gone_at=None).exclude(dra_device="")
    for key, profile in devices.values_list("dra_device", "profile"):
        resource_of[key] = "nvidia.com/mig-" + profile.replace("+", ".")
    if not resource_of:
        return {}
    try:
        claims, _ = k8s.list_all(client.ResourceV1Api(api).list_resource_claim_for_all_namespaces, limit=2000)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return claim_holdings(claims, resource_of)


def claim_demand(api, waiting: list[dict]) -> dict[str, dict[str, int]]:
    """Pod uid -> what the ResourceClaims (or claim templates) of a pod no node took yet ask (requested_resources).
    Read only when such a pod names claims; a cluster without resource.k8s.io/v1 (404) has none."""
    asking = [p for p in waiting if (p.get("spec") or {}).get("resourceClaims")]
    if not asking:
        return {}
    resources = client.ResourceV1Api(api)
    try:
        claims, _ = k8s.list_all(resources.list_resource_claim_for_all_namespaces, limit=2000)
        templates, _ = k8s.list_all(resources.list_resource_claim_template_for_all_namespaces, limit=2000)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    by_name = {(c["metadata"]["namespace"], c["metadata"]["name"]): c.get("spec") or {} for c in claims}
    by_template = {
        (t["metadata"]["namespace"], t["metadata"]["name"]): (t.get("spec") or {}).get("spec") or {} for t in templates
    }
    demand = {}
    for pod in asking:
        namespace, specs = pod["metadata"]["namespace"], []
        for entry in pod["spec"]["resourceClaims"]:
            if entry.get("resourceClaimName"):
                specs.append(by_name.get((namespace, entry["resourceClaimName"]), {}))
            else:
                specs.append(by_template.get((namespace, entry.get("resourceClaimTemplateName", "")), {}))
        wanted = requested_resources(specs)
        if wanted:
            demand[pod["metadata"]["uid"]] = wanted
    return demand


def sync_pods(cluster) -> int:
    """Every live GPU-holding pod per node (cluster-wide lists, see candidate_pods), and the GPU pods waiting for a
    node; pods gone (or started) since are removed. On DRA nodes a pod holds what its ResourceClaims were allocated
    (claim_resources), whatever its containers ask."""
    api = k8s.api_client(cluster)
    core = client.CoreV1Api(api)
    pods = candidate_pods(core, cluster.operator_namespace)
    by_node = {name: [] for name in Node.objects.live().filter(cluster=cluster).values_list("name", flat=True)}
    claimed = claim_resources(api, cluster)
    asked = claim_demand(api, [p for p in pods if not (p.get("spec") or {}).get("nodeName")])
    pending = []
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        uid = (pod.get("metadata") or {}).get("uid")
        if node in by_node and uid in claimed and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            by_node[node].append(replace(pod_observation(pod), gpu_resources=claimed[uid]))
        elif node in by_node and holds_gpu(pod, cluster.operator_namespace):
            by_node[node].append(pod_observation(pod))
        elif not node and (waiting := pending_observation(pod, asked.get(uid))) is not None:
            pending.append(waiting)
    pending_pods_record(cluster=cluster, pods=pending)
    return pods_record(cluster=cluster, pods_by_node=by_node)
