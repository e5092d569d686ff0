"""kubectl 1.32 against the simulator: the commands an admin runs next to Tessera must behave as on a cluster."""

import os
import shutil
import subprocess

import pytest
import yaml

from simulator.resources import CONFIGMAPS

pytestmark = pytest.mark.kubectl

KUBECTL = shutil.which("kubectl")
if KUBECTL is None and os.environ.get("CI") != "true":
    pytest.skip("kubectl is not installed (these tests must run in CI)", allow_module_level=True)


@pytest.fixture
def kubectl(sim, tmp_path):
    if KUBECTL is None:
        pytest.fail("kubectl is required in CI")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [KUBECTL, "--kubeconfig", sim.kubeconfig_path, "--cache-dir", str(tmp_path / "cache"), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    return run


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def test_get_nodes_with_label_columns_and_selectors(kubectl):
    # The columns of the `make run` banner's kubectl line (console/management/commands/run_embedded.py).
    columns = "nvidia.com/gpu.product,nvidia.com/mig.config,nvidia.com/mig.config.state"
    table = rows(kubectl("get", "nodes", "-L", columns).stdout)
    assert table[0] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "GPU.PRODUCT", "MIG.CONFIG", "MIG.CONFIG.STATE"]
    assert len(table) == 13
    assert table[2][:2] == ["gpu-node-0002", "Ready"] and table[2][4] == "v1.32.4"
    assert table[2][5] == "NVIDIA-H100-80GB-HBM3" and table[2][7] == "success" and table[2][6]
    selected = rows(kubectl("get", "no", "-l", "nvidia.com/gpu.product in (NVIDIA-L4,Tesla-T4)", "-o", "name").stdout)
    assert selected == [["node/gpu-node-0003"], ["node/gpu-node-0006"], ["node/gpu-node-0011"]]


def test_api_resources_discovers_every_group(kubectl):
    listed = {(row[0], row[-3]) for row in rows(kubectl("api-resources", "--no-headers").stdout)}
    assert {("pods", "v1"), ("poddisruptionbudgets", "policy/v1"), ("clusterpolicies", "nvidia.com/v1")} <= listed
    assert rows(kubectl("get", "pdb", "-A").stderr) == [["No", "resources", "found"]]


def test_get_node_as_yaml(kubectl):
    node = yaml.safe_load(kubectl("get", "node", "gpu-node-0002", "-o", "yaml").stdout)
    assert (node["kind"], node["metadata"]["name"]) == ("Node", "gpu-node-0002")
    assert node["metadata"]["labels"]["nvidia.com/mig.capable"] == "true"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_label_overwrite(kubectl, sim):
    assert "labeled" in kubectl("label", "node", "gpu-node-0002", "tessera.io/pool=day", "--overwrite").stdout
    kubectl("label", "node", "gpu-node-0002", "tessera.io/pool=night", "--overwrite")
    assert sim.node("gpu-node-0002")["metadata"]["labels"]["tessera.io/pool"] == "night"
    refused = kubectl("label", "node", "gpu-node-0002", "tessera.io/pool=again", check=False)
    assert refused.returncode != 0 and "--overwrite" in refused.stderr


def test_label_mig_config_drives_the_mig_manager(kubectl, sim):
    kubectl("label", "node", "gpu-node-0002", "nvidia.com/mig.config=all-balanced", "--overwrite")
    assert sim.settle()
    table = rows(kubectl("get", "node", "gpu-node-0002", "-L", "nvidia.com/mig.config.state").stdout)
    assert table[1][-1] == "success"


def test_configmaps_get_and_create(kubectl, sim):
    table = rows(kubectl("get", "configmaps", "-n", "gpu-operator").stdout)
    assert table[0] == ["NAME", "DATA", "AGE"]
    assert table[[r[0] for r in table].index("device-plugin-config")][:2] == ["device-plugin-config", "3"]
    created = kubectl("create", "configmap", "tessera-plugin", "-n", "gpu-operator", "--from-literal=ts-2=version: v1")
    assert "created" in created.stdout
    stored = sim.store.find(CONFIGMAPS, "gpu-operator", "tessera-plugin")
    assert stored["data"] == {"ts-2": "version: v1"}
    again = kubectl("create", "configmap", "tessera-plugin", "-n", "gpu-operator", check=False)
    assert again.returncode != 0 and 'configmaps "tessera-plugin" already exists' in again.stderr


def test_get_pods_on_a_node_across_namespaces(kubectl):
    table = rows(kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=gpu-node-0008", "-o", "wide").stdout)
    assert table[0][:3] == ["NAMESPACE", "NAME", "READY"]
    namespaces = {row[0] for row in table[1:]}
    assert "gpu-operator" in namespaces and namespaces & {"ml-training", "inference", "research"}
    assert {row[7] for row in table[1:]} == {"gpu-node-0008"}


def test_cordon_and_uncordon(kubectl, sim):
    kubectl("cordon", "gpu-node-0004")
    assert rows(kubectl("get", "node", "gpu-node-0004").stdout)[1][1] == "Ready,SchedulingDisabled"
    assert sim.node("gpu-node-0004")["spec"]["taints"][0]["key"] == "node.kubernetes.io/unschedulable"
    kubectl("uncordon", "gpu-node-0004")
    assert "unschedulable" not in sim.node("gpu-node-0004")["spec"]


def test_drain_evicts_workload_and_ignores_daemonsets(kubectl, sim):
    node = "gpu-node-0002"
    pods = [sim.add_pod(node, namespace=ns, controller="Job") for ns in ("ml-training", "research")]
    result = kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=20s")
    for pod in pods:
        assert f"evicting pod {pod['metadata']['namespace']}/{pod['metadata']['name']}" in result.stdout + result.stderr
    assert "drained" in result.stdout
    left = rows(kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "--no-headers").stdout)
    assert {row[0] for row in left} == {"gpu-operator"}  # only the DaemonSet pods stay
    assert sim.node(node)["spec"]["unschedulable"] is True
