"""The RBAC of the rendered overlays grants what the Kubernetes driver and the inventory call, and nothing more
(issue 15 point 11, issue 19 point 1): every client call in worker/ maps to the permissions it needs, a call not
mapped fails the test, and the grants of all overlays and components together are exactly what is needed."""

import re

import pytest

from tests.deploy.manifests import COMPONENTS, OVERLAYS, ROOT, by_kind, render

CLUSTER, OPERATOR = "cluster-wide", "operator namespace"
# Each Kubernetes client method worker/ may call, and what it needs: (resource, verb, scope). A call missing here
# fails the test below, so a new call comes with its permission.
CALLS = {
    "list_node": [("nodes", "list", CLUSTER), ("nodes", "watch", CLUSTER)],  # the inventory lists, then watches
    "read_node": [("nodes", "get", CLUSTER)],
    "patch_node": [("nodes", "patch", CLUSTER)],
    "list_pod_for_all_namespaces": [("pods", "list", CLUSTER)],
    "create_namespaced_pod_eviction": [("pods/eviction", "create", CLUSTER)],
    "list_namespaced_pod": [("pods", "list", OPERATOR)],
    "delete_namespaced_pod": [("pods", "delete", OPERATOR)],
    "connect_get_namespaced_pod_proxy_with_path": [("pods/proxy", "get", OPERATOR)],
    "connect_get_node_proxy_with_path": [("nodes/proxy", "get", CLUSTER)],
    "list_namespaced_service": [("services", "list", OPERATOR)],
    "read_namespaced_daemon_set": [("daemonsets", "get", OPERATOR)],
    "create_token_review": [("tokenreviews", "create", CLUSTER)],  # agents in DaemonSet pods (docs/security.md)
    "list_namespaced_event": [("events", "list", OPERATOR)],
    "read_namespaced_config_map": [("configmaps", "get", OPERATOR)],
    "list_namespaced_config_map": [("configmaps", "list", OPERATOR)],
    "create_namespaced_config_map": [("configmaps", "create", OPERATOR)],
    "replace_namespaced_config_map": [("configmaps", "update", OPERATOR)],
    "list_cluster_custom_object": [
        ("clusterpolicies", "list", CLUSTER),
        ("localqueues", "list", CLUSTER),  # Kueue Workloads as demand (deploy/components/kueue)
        ("workloads", "list", CLUSTER),
    ],
    "patch_cluster_custom_object": [
        ("clusterpolicies", "patch", CLUSTER),
        ("resourceflavors", "patch", CLUSTER),  # Kueue (deploy/components/kueue)
        ("clusterqueues", "patch", CLUSTER),
    ],
    "get_cluster_custom_object": [("resourceflavors", "get", CLUSTER), ("clusterqueues", "get", CLUSTER)],
    "create_cluster_custom_object": [("resourceflavors", "create", CLUSTER)],
    **{
        f"{verb}_validating_admission_policy{suffix}": [(f"validatingadmissionpolic{plural}", rbac, CLUSTER)]
        for suffix, plural in (("", "ies"), ("_binding", "ybindings"))
        for verb, rbac in (
            ("list", "list"),
            ("read", "get"),
            ("create", "create"),
            ("replace", "update"),
            ("delete", "delete"),
        )
    },  # fmt: skip
}
# The dcgm-exporter scrape moves from the node proxy to the exporter pods' proxy (worker/inventory): the node proxy
# is no longer granted, the pod proxy already is.
MOVING = {("nodes/proxy", "get", CLUSTER), ("pods/proxy", "get", OPERATOR)}
CALL = re.compile(r"\.((?:list|read|patch|create|delete|replace|connect_get)_[a-z_]+|get_cluster_custom_object)\b")


def _called() -> set[str]:
    names = set()
    for path in (ROOT / "worker").rglob("*.py"):
        names |= set(CALL.findall(path.read_text()))
    return names


def _granted(objects: list[dict]) -> set[tuple[str, str, str]]:
    """(resource, verb, scope) granted to Tessera's service account by the roles bound to it."""
    roles = {("ClusterRole", o["metadata"]["name"]): o for o in objects if o["kind"] == "ClusterRole"}
    roles |= {("Role", o["metadata"]["name"]): o for o in objects if o["kind"] == "Role"}
    granted = set()
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tessera", "namespace": "tessera-system"}]
        role = roles.pop((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
        scope = CLUSTER if role["kind"] == "ClusterRole" and binding["kind"] == "ClusterRoleBinding" else OPERATOR
        if scope == OPERATOR:
            assert binding["metadata"]["namespace"] == "gpu-operator", binding["metadata"]
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "*" not in rule["verbs"] + rule["resources"], rule
            granted |= {(resource, verb, scope) for resource in rule["resources"] for verb in rule["verbs"]}
    assert not roles, f"roles bound to nobody: {sorted(roles)}"
    return granted


@pytest.fixture(scope="module")
def grants(tmp_path_factory) -> dict[str, set]:
    """What each overlay grants, and the gpu-operator overlay with every component."""
    grants = {overlay: _granted(render(overlay)) for overlay in OVERLAYS}
    grants["gpu-operator+components"] = _granted(
        render("gpu-operator", *COMPONENTS, tmp_path=tmp_path_factory.mktemp("kustomize"))
    )
    return grants


def test_rbac_grants_what_the_code_calls_and_nothing_more(grants):
    called = _called()
    kube_calls = {name for name in called if name in CALLS}
    unknown = {n for n in called if n.endswith(("_node", "_pod", "_map", "_object", "_binding", "_policy", "_event"))}
    assert unknown <= set(CALLS), f"calls without a permission in CALLS: {sorted(unknown - set(CALLS))}"
    needed = {permission for name in kube_calls for permission in CALLS[name]}
    granted = set().union(*grants.values())
    assert needed - granted <= MOVING, f"called, not granted: {sorted(needed - granted - MOVING)}"
    assert granted - needed <= MOVING, f"granted, never called: {sorted(granted - needed - MOVING)}"


def test_each_overlay_grants_only_what_its_clusters_need(grants):
    review = {("tokenreviews", "create", CLUSTER)}
    assert grants["agent-only"] == review  # agents' pod tokens reviewed; no node, pod or ConfigMap is touched
    operator = grants["gpu-operator"]
    assert ("nodes", "patch", CLUSTER) in operator and ("configmaps", "update", OPERATOR) in operator
    assert not {g for g in operator if g[0].startswith("validatingadmission")}  # only with the admission component
    kueue = ("resourceflavors", "clusterqueues", "localqueues", "workloads")
    assert not {g for g in operator if g[0] in kueue}  # only with the kueue component
    assert {g[0] for g in grants["gpu-operator+components"] - operator} == {
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        *kueue,
    }


def test_rbac_grants_no_node_proxy_and_no_cluster_wide_pod_delete(grants):
    granted = set().union(*grants.values())
    assert ("nodes/proxy", "get", CLUSTER) not in granted  # the kubelet API of every node
    assert ("pods", "delete", CLUSTER) not in granted  # evictions respect PodDisruptionBudgets; deletes do not
    assert not {g for g in granted if g[0].startswith("validatingadmission") and g[1] == "patch"}


def test_the_agent_mounts_no_kubernetes_api_token():
    objects = render("agent-only")
    assert by_kind(objects, "ServiceAccount")["tessera-agent"]["automountServiceAccountToken"] is False
    pod = by_kind(objects, "DaemonSet")["tessera-agent"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
