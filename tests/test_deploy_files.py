"""The compose file is valid for Docker Compose (validated where a compose client is installed); the Kubernetes
manifests are well formed, and their RBAC grants what worker/ calls and nothing more (issue 15, point 11)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compose_command():
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("no Docker Compose client installed")


def test_compose_file_is_valid():
    result = subprocess.run(
        [*_compose_command(), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        env={"DJANGO_SECRET_KEY": "validation-only", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr


def _manifests():
    import yaml

    for path in sorted((ROOT / "deploy").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def test_manifests_are_well_formed_and_run_one_beat():
    docs = list(_manifests())
    assert docs
    for name, doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), name
        assert doc["metadata"].get("name"), name
    deployments = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Deployment"}
    assert set(deployments) >= {"tessera-web", "tessera-worker", "tessera-beat", "tessera-watcher"}
    assert deployments["tessera-beat"]["spec"]["replicas"] == 1


# --- RBAC: what the code calls, and nothing more ---------------------------------------------------------------------

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
    "list_cluster_custom_object": [("clusterpolicies", "list", CLUSTER)],
    "patch_cluster_custom_object": [("clusterpolicies", "patch", CLUSTER)],
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
CALL = re.compile(r"\.((?:list|read|patch|create|delete|replace|connect_get)_[a-z_]+)\b")


def _called() -> set[str]:
    names = set()
    for path in (ROOT / "worker").rglob("*.py"):
        names |= set(CALL.findall(path.read_text()))
    return names


def _granted() -> set[tuple[str, str, str]]:
    granted = set()
    for _, doc in _manifests():
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        scope = CLUSTER if doc["kind"] == "ClusterRole" else OPERATOR
        assert doc["kind"] == "ClusterRole" or doc["metadata"]["namespace"] == "gpu-operator", doc["metadata"]
        for rule in doc["rules"]:
            assert "resourceNames" not in rule and "*" not in rule["verbs"] + rule["resources"], rule
            granted |= {(resource, verb, scope) for resource in rule["resources"] for verb in rule["verbs"]}
    return granted


def test_rbac_grants_what_the_code_calls_and_nothing_more():
    called = _called()
    kube_calls = {name for name in called if name in CALLS}
    unknown = {n for n in called if n.endswith(("_node", "_pod", "_map", "_object", "_binding", "_policy", "_event"))}
    assert unknown <= set(CALLS), f"calls without a permission in CALLS: {sorted(unknown - set(CALLS))}"
    needed = {permission for name in kube_calls for permission in CALLS[name]}
    granted = _granted()
    assert needed - granted <= MOVING, f"called, not granted: {sorted(needed - granted - MOVING)}"
    assert granted - needed <= MOVING, f"granted, never called: {sorted(granted - needed - MOVING)}"


def test_rbac_grants_no_node_proxy_and_no_cluster_wide_pod_delete():
    granted = _granted()
    assert ("nodes/proxy", "get", CLUSTER) not in granted  # the kubelet API of every node
    assert ("pods", "delete", CLUSTER) not in granted  # evictions respect PodDisruptionBudgets; deletes do not
    assert not {g for g in granted if g[0].startswith("validatingadmission") and g[1] == "patch"}
