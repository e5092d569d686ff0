"""Kueue objects Tessera writes (kueue.x-k8s.io/v1beta1, docs/kueue.md): its ResourceFlavors, and the nominalQuota of
its flavors inside ClusterQueues it is told to manage. A ClusterQueue is never replaced: one JSON patch (RFC 6902)
touches only Tessera's flavor entries (and, when a resource is new to the group, appends it with quota 0 to the
other flavors, as Kueue requires every flavor of a group to list every covered resource), guarded by a `test` of the
resourceVersion it was computed from, so a concurrent edit makes it fail (409/422) instead of being overwritten.
"""

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from capacity.kueue import SeenWorkload
from worker.drivers.kubernetes.api import MERGE_PATCH, call, list_all, read_json
from worker.drivers.kubernetes.labels import MANAGED_BY, MANAGED_BY_TESSERA, instant, pod_gpu_resources

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
JSON_PATCH = "application/json-patch+json"


def count(value) -> int | None:
    """A nominalQuota as a whole count ("4", 4), or None for anything else (a value Tessera never writes)."""
    try:
        return int(str(value))
    except ValueError:
        return None


def live_quota(cq: dict, flavors) -> dict[tuple[str, str], int | None]:
    """(flavor, resource) -> nominalQuota in the ClusterQueue, for the named flavors."""
    found = {}
    for group in (cq.get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            if flavor.get("name") in flavors:
                for resource in flavor.get("resources") or []:
                    found[(flavor["name"], resource.get("name"))] = count(resource.get("nominalQuota"))
    return found


def in_use(cq: dict, flavors) -> dict[str, dict[str, int]]:
    """Per flavor and resource, what admitted workloads use (status.flavorsUsage; rounded up to whole devices)."""
    result: dict[str, dict[str, int]] = {}
    for flavor in (cq.get("status") or {}).get("flavorsUsage") or []:
        if flavor.get("name") in flavors:
            result[flavor["name"]] = {r["name"]: count(r.get("total", "0")) or 0 for r in flavor.get("resources") or []}
    return result


def quota_patch(cq: dict, wanted: dict[str, dict[str, int]], resources: list[str]) -> list[dict]:
    """The JSON patch giving Tessera's flavors (`wanted`: flavor -> resource -> count) their quota; [] when the
    ClusterQueue has it already."""
    spec = cq.get("spec") or {}
    groups = spec.get("resourceGroups")
    entry = lambda name: {  # noqa: E731 - one flavor entry in Kueue's shape
        "name": name,
        "resources": [{"name": r, "nominalQuota": str(wanted[name].get(r, 0))} for r in resources],
    }
    new_group = {"coveredResources": list(resources), "flavors": [entry(f) for f in sorted(wanted)]}
    if not groups:
        return [{"op": "add", "path": "/spec/resourceGroups", "value": [new_group]}]
    index = next(
        (
            i
            for i, g in enumerate(groups)
            if set(g.get("coveredResources") or []) & set(resources)
            or {f.get("name") for f in g.get("flavors") or []} & set(wanted)
        ),
        None,
    )
    if index is None:
        return [{"op": "add", "path": "/spec/resourceGroups/-", "value": new_group}]
    group, base = groups[index], f"/spec/resourceGroups/{index}"
    ops = []
    covered = list(group.get("coveredResources") or [])
    for resource in resources:
        if resource not in covered:
            covered.append(resource)
            ops.append({"op": "add", "path": f"{base}/coveredResources/-", "value": resource})
            for j, flavor in enumerate(group.get("flavors") or []):
                if flavor.get("name") not in wanted:
                    ops.append(
                        {
                            "op": "add",
                            "path": f"{base}/flavors/{j}/resources/-",
                            "value": {"name": resource, "nominalQuota": "0"},
                        }
                    )
    present = {f.get("name"): j for j, f in enumerate(group.get("flavors") or [])}
    for name in sorted(wanted):
        if name not in present:
            value = {
                "name": name,
                "resources": [{"name": r, "nominalQuota": str(wanted[name].get(r, 0))} for r in covered],
            }
            ops.append({"op": "add", "path": f"{base}/flavors/-", "value": value})
            continue
        j = present[name]
        entries = {r.get("name"): k for k, r in enumerate(group["flavors"][j].get("resources") or [])}
        for resource in covered:
            target = str(wanted[name].get(resource, 0))
            if resource not in entries:
                item = {"name": resource, "nominalQuota": target}
                ops.append({"op": "add", "path": f"{base}/flavors/{j}/resources/-", "value": item})
            elif resource in resources:  # a resource of the group Tessera does not manage keeps its quota
                k = entries[resource]
                if str(group["flavors"][j]["resources"][k].get("nominalQuota")) != target:
                    path = f"{base}/flavors/{j}/resources/{k}/nominalQuota"
                    ops.append({"op": "replace", "path": path, "value": target})
    return ops


def _true_since(workload: dict, kind: str):
    """When the condition `kind` became True; None while it is not."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    found = next((c for c in conditions if c.get("type") == kind and c.get("status") == "True"), None)
    return instant(found.get("lastTransitionTime")) if found else None


def seen_workload(workload: dict, queues: dict[tuple[str, str], str]) -> SeenWorkload | None:
    """What capacity records of one Workload (`queues`: (namespace, LocalQueue) -> ClusterQueue); None for one that
    finished without being admitted (nothing waits)."""
    meta, spec = workload.get("metadata") or {}, workload.get("spec") or {}
    admission = (workload.get("status") or {}).get("admission") or {}
    admitted = _true_since(workload, "Admitted")
    if admitted is None and _true_since(workload, "Finished"):
        return None
    requests: dict[str, int] = {}
    for podset in spec.get("podSets") or []:
        count = int(podset.get("count", 1))
        for resource, units in pod_gpu_resources(podset.get("template") or {}).items():
            requests[resource] = requests.get(resource, 0) + units * count
    namespace = meta.get("namespace", "")
    return SeenWorkload(
        namespace=namespace,
        name=meta.get("name", ""),
        cluster_queue=admission.get("clusterQueue") or queues.get((namespace, spec.get("queueName", "")), ""),
        flavors=frozenset(
            flavor
            for podset in admission.get("podSetAssignments") or []
            for flavor in (podset.get("flavors") or {}).values()
        ),
        requests=requests,
        created_at=instant(meta.get("creationTimestamp")),
        admitted_at=admitted,
    )


class KueueObjects:
    """One cluster's Kueue API, through the official client's CustomObjectsApi."""

    def __init__(self, api: client.ApiClient):
        self.custom = client.CustomObjectsApi(api)

    def cluster_queue(self, name: str) -> dict | None:
        try:
            return read_json(self.custom.get_cluster_custom_object, GROUP, VERSION, "clusterqueues", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def workloads(self) -> list[SeenWorkload]:
        """Every Workload of every namespace, with the ClusterQueue its LocalQueue points to."""
        local_queues, _ = list_all(self.custom.list_cluster_custom_object, GROUP, VERSION, "localqueues")
        queues = {
            ((q.get("metadata") or {}).get("namespace", ""), (q.get("metadata") or {}).get("name", "")): (
                q.get("spec") or {}
            ).get("clusterQueue", "")
            for q in local_queues
        }
        workloads, _ = list_all(self.custom.list_cluster_custom_object, GROUP, VERSION, "workloads")
        return [seen for seen in (seen_workload(w, queues) for w in workloads) if seen is not None]

    def ensure_flavor(self, name: str, node_labels: dict[str, str]) -> str:
        """Create the flavor, or set its nodeLabels; "created", "updated" or "" (already so)."""
        try:
            live = read_json(self.custom.get_cluster_custom_object, GROUP, VERSION, "resourceflavors", name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceFlavor",
                "metadata": {"name": name, "labels": {MANAGED_BY: MANAGED_BY_TESSERA}},
                "spec": {"nodeLabels": node_labels},
            }
            call(self.custom.create_cluster_custom_object, GROUP, VERSION, "resourceflavors", body)
            return "created"
        current = (live.get("spec") or {}).get("nodeLabels") or {}
        if current == node_labels:
            return ""
        labels = {**dict.fromkeys(set(current) - set(node_labels)), **node_labels}  # null removes a stale key
        patch = {"spec": {"nodeLabels": labels}}
        call(
            self.custom.patch_cluster_custom_object,
            GROUP,
            VERSION,
            "resourceflavors",
            name,
            patch,
            _content_type=MERGE_PATCH,
        )
        return "updated"

    def patch_cluster_queue(self, cq: dict, ops: list[dict]) -> dict:
        """Apply `ops` to the ClusterQueue as it was read (a `test` of its resourceVersion goes first; no retry on
        conflict: the next sync reads it again)."""
        guard = {"op": "test", "path": "/metadata/resourceVersion", "value": cq["metadata"]["resourceVersion"]}
        return read_json(
            self.custom.patch_cluster_custom_object,
            GROUP,
            VERSION,
            "clusterqueues",
            cq["metadata"]["name"],
            [guard, *ops],
            _content_type=JSON_PATCH,
            retry_if=lambda exc: isinstance(exc, ApiException) and exc.status in (429, 500, 502, 503, 504, 0),
        )
