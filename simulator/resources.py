"""The resource types the emulated API serves, and the discovery documents kubectl builds its REST mapper from."""

from __future__ import annotations

from dataclasses import dataclass, field

_READ = ("get", "list", "watch")
_WRITE = ("create", "delete", "patch", "update")


@dataclass(frozen=True)
class ResourceType:
    plural: str
    singular: str
    kind: str
    group: str
    version: str
    namespaced: bool
    verbs: tuple[str, ...]
    short_names: tuple[str, ...] = ()
    field_selectors: frozenset[str] = field(default_factory=frozenset)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """`plural.group` as kubectl names a resource (`validatingadmissionpolicies.admissionregistration.k8s.io`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery(self) -> dict:
        entry = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        return entry


_META_FIELDS = frozenset({"metadata.name", "metadata.namespace"})

NODES = ResourceType(
    "nodes",
    "node",
    "Node",
    "",
    "v1",
    False,
    _READ + ("patch", "update"),
    ("no",),
    frozenset({"metadata.name", "spec.unschedulable"}),
)
PODS = ResourceType(
    "pods",
    "pod",
    "Pod",
    "",
    "v1",
    True,
    ("delete", "get", "list", "watch"),
    ("po",),
    _META_FIELDS
    | {"spec.nodeName", "status.phase", "spec.schedulerName", "spec.serviceAccountName", "spec.restartPolicy"},
)
CONFIGMAPS = ResourceType("configmaps", "configmap", "ConfigMap", "", "v1", True, _READ + _WRITE, ("cm",), _META_FIELDS)
NAMESPACES = ResourceType(
    "namespaces", "namespace", "Namespace", "", "v1", False, _READ + ("create",), ("ns",), _META_FIELDS
)
EVENTS = ResourceType(
    "events",
    "event",
    "Event",
    "",
    "v1",
    True,
    _READ,
    ("ev",),
    _META_FIELDS
    | {
        "involvedObject.kind",
        "involvedObject.name",
        "involvedObject.namespace",
        "involvedObject.uid",
        "reason",
        "type",
        "source",
    },
)
SERVICES = ResourceType("services", "service", "Service", "", "v1", True, _READ, ("svc",), _META_FIELDS)
DAEMONSETS = ResourceType("daemonsets", "daemonset", "DaemonSet", "apps", "v1", True, _READ, ("ds",), _META_FIELDS)
# policy/v1 must list a resource, or discovery (`kubectl api-resources`) reports the group version as broken. Served
# read-only and empty: evictions here never consult a budget.
POD_DISRUPTION_BUDGETS = ResourceType(
    "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", "policy", "v1", True, _READ, ("pdb",)
)
CLUSTER_POLICIES = ResourceType(
    "clusterpolicies", "clusterpolicy", "ClusterPolicy", "nvidia.com", "v1", False, _READ + ("patch", "update"), ()
)
# Admission policies (Kubernetes >= 1.30 serves them in v1): stored and served, never evaluated (no pods are created).
ADMISSION_GROUP = "admissionregistration.k8s.io"
VALIDATING_ADMISSION_POLICIES = ResourceType(
    "validatingadmissionpolicies",
    "validatingadmissionpolicy",
    "ValidatingAdmissionPolicy",
    ADMISSION_GROUP,
    "v1",
    False,
    _READ + _WRITE,
    (),
    _META_FIELDS,
)
VALIDATING_ADMISSION_POLICY_BINDINGS = ResourceType(
    "validatingadmissionpolicybindings",
    "validatingadmissionpolicybinding",
    "ValidatingAdmissionPolicyBinding",
    ADMISSION_GROUP,
    "v1",
    False,
    _READ + _WRITE,
    (),
    _META_FIELDS,
)

# Kueue (kueue.x-k8s.io/v1beta1, sigs.k8s.io/kueue apis/kueue/v1beta1, docs/kueue.md): scopes, short names and the
# status subresource as the CRDs declare them. The simulator's own admission controller is simulator/kueue.py.
KUEUE_GROUP = "kueue.x-k8s.io"
RESOURCE_FLAVORS = ResourceType(
    "resourceflavors",
    "resourceflavor",
    "ResourceFlavor",
    KUEUE_GROUP,
    "v1beta1",
    False,
    _READ + _WRITE,
    ("flavor", "flavors", "rf"),
    _META_FIELDS,
)
CLUSTER_QUEUES = ResourceType(
    "clusterqueues",
    "clusterqueue",
    "ClusterQueue",
    KUEUE_GROUP,
    "v1beta1",
    False,
    _READ + _WRITE,
    ("cq",),
    _META_FIELDS,
)
LOCAL_QUEUES = ResourceType(
    "localqueues",
    "localqueue",
    "LocalQueue",
    KUEUE_GROUP,
    "v1beta1",
    True,
    _READ + _WRITE,
    ("queue", "queues", "lq"),
    _META_FIELDS,
)
WORKLOADS = ResourceType(
    "workloads",
    "workload",
    "Workload",
    KUEUE_GROUP,
    "v1beta1",
    True,
    _READ + _WRITE,
    ("kwl", "kueueworkload", "kueueworkloads"),
    _META_FIELDS,
)
KUEUE = (RESOURCE_FLAVORS, CLUSTER_QUEUES, LOCAL_QUEUES, WORKLOADS)

# Dynamic Resource Allocation (resource.k8s.io/v1, GA in Kubernetes 1.34; types in k8s.io/api/resource/v1/types.go,
# docs/nvidia-contracts.md §13): scopes, short names and field selectors as kube-apiserver serves them. The GPU
# driver's kubelet plugin and the scheduler's allocator are simulator/dra.py.
RESOURCE_GROUP = "resource.k8s.io"
DEVICE_CLASSES = ResourceType(
    "deviceclasses", "deviceclass", "DeviceClass", RESOURCE_GROUP, "v1", False, _READ + _WRITE, (), _META_FIELDS
)
RESOURCE_SLICES = ResourceType(
    "resourceslices",
    "resourceslice",
    "ResourceSlice",
    RESOURCE_GROUP,
    "v1",
    False,
    _READ + _WRITE,
    (),
    _META_FIELDS | {"spec.nodeName", "spec.driver"},
)
RESOURCE_CLAIMS = ResourceType(
    "resourceclaims", "resourceclaim", "ResourceClaim", RESOURCE_GROUP, "v1", True, _READ + _WRITE, (), _META_FIELDS
)
RESOURCE_CLAIM_TEMPLATES = ResourceType(
    "resourceclaimtemplates",
    "resourceclaimtemplate",
    "ResourceClaimTemplate",
    RESOURCE_GROUP,
    "v1",
    True,
    _READ + _WRITE,
    (),
    _META_FIELDS,
)
DRA = (DEVICE_CLASSES, RESOURCE_SLICES, RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES)
# Served with a `status` subresource: the main endpoint keeps status as it is, `<name>/status` changes only status.
STATUS_SUBRESOURCE = frozenset({"clusterqueues", "localqueues", "workloads", "resourceclaims"})

ALL = (
    NODES,
    PODS,
    CONFIGMAPS,
    NAMESPACES,
    EVENTS,
    SERVICES,
    DAEMONSETS,
    POD_DISRUPTION_BUDGETS,
    CLUSTER_POLICIES,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    *KUEUE,
    *DRA,
)
BY_GROUP_VERSION: dict[tuple[str, str], dict[str, ResourceType]] = {}
for _resource in ALL:
    BY_GROUP_VERSION.setdefault((_resource.group, _resource.version), {})[_resource.plural] = _resource

# Served subresources; without `pods/eviction` in policy/v1, `kubectl drain` silently deletes instead of evicting.
_SUBRESOURCES = {
    ("", "v1"): [
        {
            "name": "pods/eviction",
            "singularName": "",
            "namespaced": True,
            "group": "policy",
            "version": "v1",
            "kind": "Eviction",
            "verbs": ["create"],
        },
        {"name": "nodes/proxy", "singularName": "", "namespaced": False, "kind": "NodeProxyOptions", "verbs": ["get"]},
        {"name": "pods/proxy", "singularName": "", "namespaced": True, "kind": "PodProxyOptions", "verbs": ["get"]},
    ]
}
GROUPS = (
    ("apps", "v1"),
    ("policy", "v1"),
    ("nvidia.com", "v1"),
    (ADMISSION_GROUP, "v1"),
    (KUEUE_GROUP, "v1beta1"),
    (RESOURCE_GROUP, "v1"),
)


def api_versions() -> dict:
    return {
        "kind": "APIVersions",
        "apiVersion": "v1",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
    }


def _group(name: str, version: str) -> dict:
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


def api_group_list() -> dict:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(name, version) for name, version in GROUPS]}


def api_group(name: str) -> dict | None:
    for group, version in GROUPS:
        if group == name:
            return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, version)}
    return None


def api_resource_list(group: str, version: str, unserved: frozenset[str] = frozenset()) -> dict | None:
    """The group version's resources, less those the `unserved` fault knob hides (an older API server)."""
    if (group, version) not in GROUPS and (group, version) != ("", "v1"):
        return None
    resources = [
        r.discovery() for r in BY_GROUP_VERSION.get((group, version), {}).values() if r.qualified not in unserved
    ]
    resources += _SUBRESOURCES.get((group, version), [])
    resources += [
        {
            "name": f"{r.plural}/status",
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["get", "patch", "update"],
        }
        for r in BY_GROUP_VERSION.get((group, version), {}).values()
        if r.plural in STATUS_SUBRESOURCE and r.qualified not in unserved
    ]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }
