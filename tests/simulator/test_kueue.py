"""Kueue's v1beta1 kinds on the simulator, written and read by the official client and by kubectl, and its minimal
admission controller: a Workload is admitted while its ClusterQueue has free nominal quota in a matching flavor."""

import json
import shutil
import subprocess
import time

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"


@pytest.fixture
def custom(sim):
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        yield client.CustomObjectsApi(api)


def flavor(name: str, labels: dict) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": labels},
    }


def cluster_queue(name: str, quotas: dict[str, dict[str, str]], covered: list[str]) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": covered,
                    "flavors": [
                        {"name": f, "resources": [{"name": r, "nominalQuota": q.get(r, "0")} for r in covered]}
                        for f, q in quotas.items()
                    ],
                }
            ],
        },
    }


def workload(name: str, resource: str, count: int = 1, selector: dict | None = None) -> dict:
    spec = {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {resource: "1"}}}]}
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"queueName": "team", "podSets": [{"name": "main", "count": count, "template": {"spec": spec}}]},
    }


def local_queue(cq: str) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": "team", "namespace": "default"},
        "spec": {"clusterQueue": cq},
    }


def _get(custom, plural, name, namespace=None):
    if namespace:
        return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    return custom.get_cluster_custom_object(GROUP, VERSION, plural, name)


def _admitted(obj: dict) -> str:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == "Admitted"), "")


def test_workloads_are_admitted_within_nominal_quota_and_usage_is_reported(sim, custom):
    custom.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", flavor("whole", {"gpu": "whole"}))
    custom.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", flavor("sliced", {"gpu": "sliced"}))
    custom.create_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", cluster_queue("cq", {"whole": {GPU: "2"}, "sliced": {MIG: "1"}}, [GPU, MIG])
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "localqueues", local_queue("cq"))
    for name in ("a", "b", "c"):
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", "workloads", workload(name, GPU))
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", "workloads", workload("m", MIG, selector={"gpu": "whole"})
    )
    assert sim.settle()

    a, b, c, m = (_get(custom, "workloads", n, "default") for n in "abcm")
    assert [_admitted(w) for w in (a, b, c)] == ["True", "True", ""]
    assert a["status"]["admission"] == {
        "clusterQueue": "cq",
        "podSetAssignments": [{"name": "main", "flavors": {GPU: "whole"}, "resourceUsage": {GPU: "1"}, "count": 1}],
    }
    reserved = next(x for x in c["status"]["conditions"] if x["type"] == "QuotaReserved")
    assert (
        reserved["status"] == "False"
        and "insufficient unused quota for nvidia.com/gpu in flavor whole" in reserved["message"]
    )
    # The MIG workload selects gpu=whole: the sliced flavor's nodeLabels contradict it, so it waits.
    assert "flavor sliced doesn't match node affinity" in m["status"]["conditions"][0]["message"]
    cq = _get(custom, "clusterqueues", "cq")
    assert cq["status"]["admittedWorkloads"] == 2 and cq["status"]["pendingWorkloads"] == 2
    usage = {f["name"]: {r["name"]: r["total"] for r in f["resources"]} for f in cq["status"]["flavorsUsage"]}
    assert usage == {"whole": {GPU: "2", MIG: "0"}, "sliced": {GPU: "0", MIG: "0"}}

    # Raising the quota with a JSON patch admits the waiting workload; the spec write keeps the status.
    custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        "clusterqueues",
        "cq",
        [{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "value": "3"}],
        _content_type="application/json-patch+json",
    )
    assert sim.settle()
    assert _admitted(_get(custom, "workloads", "c", "default")) == "True"

    # A finished workload frees its quota.
    finished = {
        "type": "Finished",
        "status": "True",
        "reason": "Succeeded",
        "message": "done",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    a = _get(custom, "workloads", "a", "default")
    a["status"]["conditions"].append(finished)
    custom.replace_namespaced_custom_object_status(GROUP, VERSION, "default", "workloads", "a", a)
    assert sim.settle()
    cq = _get(custom, "clusterqueues", "cq")
    assert cq["status"]["flavorsUsage"][0]["resources"][0] == {"name": GPU, "total": "2", "borrowed": "0"}


def test_main_endpoint_keeps_status_and_status_endpoint_keeps_spec(sim, custom):
    custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", cluster_queue("cq", {}, [GPU]))
    assert sim.settle()
    cq = _get(custom, "clusterqueues", "cq")
    cq["status"]["pendingWorkloads"] = 99
    cq["spec"]["cohort"] = "all"
    replaced = custom.replace_cluster_custom_object(GROUP, VERSION, "clusterqueues", "cq", cq)
    assert replaced["spec"]["cohort"] == "all" and replaced["status"]["pendingWorkloads"] == 0
    replaced["spec"]["cohort"] = "other"
    replaced["status"]["pendingWorkloads"] = 5
    status = custom.replace_cluster_custom_object_status(GROUP, VERSION, "clusterqueues", "cq", replaced)
    assert status["spec"]["cohort"] == "all" and status["status"]["pendingWorkloads"] == 5
    with pytest.raises(ApiException) as missing:
        custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "absent")
    assert missing.value.status == 404


KUBECTL = shutil.which("kubectl")


@pytest.mark.kubectl
@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_applies_reads_and_patches_cluster_queues(sim, tmp_path):
    def kubectl(*args: str, stdin: str | None = None) -> str:
        command = [KUBECTL, "--kubeconfig", sim.kubeconfig_path, "--cache-dir", str(tmp_path / "cache"), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, input=stdin)
        assert result.returncode == 0, result.stderr
        return result.stdout

    manifest = [flavor("whole", {"gpu": "whole"}), cluster_queue("cq", {"whole": {GPU: "1"}}, [GPU]), local_queue("cq")]
    manifest.append(workload("w1", GPU))
    for obj in manifest:
        kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps(obj))  # no OpenAPI schemas served
    deadline = time.monotonic() + 10
    while "True" not in kubectl("get", "workloads", "-n", "default") and time.monotonic() < deadline:
        time.sleep(0.1)
    table = [line.split() for line in kubectl("get", "workloads.kueue.x-k8s.io", "-n", "default").splitlines()]
    assert table[0][:4] == ["NAME", "QUEUE", "RESERVED", "IN"] and table[1][:4] == ["w1", "team", "cq", "True"]
    assert [line.split() for line in kubectl("get", "cq").splitlines()] == [
        ["NAME", "COHORT", "PENDING", "WORKLOADS"],
        ["cq", "0"],
    ]
    kubectl("patch", "clusterqueue", "cq", "--type=merge", "-p", json.dumps({"spec": {"cohort": "all"}}))
    read = json.loads(kubectl("get", "clusterqueue", "cq", "-o", "json"))
    assert read["spec"]["cohort"] == "all"
    assert read["status"]["flavorsUsage"] == [
        {"name": "whole", "resources": [{"name": GPU, "total": "1", "borrowed": "0"}]}
    ]
    assert json.loads(kubectl("get", "rf", "whole", "-o", "json"))["spec"]["nodeLabels"] == {"gpu": "whole"}
