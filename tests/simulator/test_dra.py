"""The simulator's DRA: resource.k8s.io/v1 objects over the real API, NVIDIA's GPU kubelet plugin on DRA nodes and an
allocator that evaluates CEL selectors (docs/nvidia-contracts.md §13), all through the official client."""

import json
import os
import re
import shutil
import subprocess

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from simulator import Simulator
from simulator.dra import PLUGIN_NAMESPACE
from tests.simulator.conftest import wait_for

MERGE = "application/merge-patch+json"
GPU_KEYS = {
    "type",
    "uuid",
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "resource.kubernetes.io/pciBusID",
}
MIG_NAME = re.compile(r"^gpu-\d+-mig-[a-z0-9-]+-\d+-\d+$")


@pytest.fixture(scope="module")
def dra_sim():
    with Simulator(nodes=8, seed=7, apply_delay=0.0, workload_pods=4, dra_nodes="mixed") as simulator:
        yield simulator


@pytest.fixture(scope="module")
def api(dra_sim):
    from kubernetes import config

    with config.new_client_from_config(config_file=dra_sim.kubeconfig_path) as k8s:
        yield k8s


@pytest.fixture
def resource(api):
    return client.ResourceV1Api(api)


@pytest.fixture
def core(api):
    return client.CoreV1Api(api)


def pool(resource, node: str) -> list:
    return resource.list_resource_slice(field_selector=f"spec.nodeName={node},spec.driver=gpu.nvidia.com").items


def test_dra_nodes_publish_one_pool_named_after_the_node_and_no_gpu_resources(dra_sim, resource, core):
    dra_nodes = sorted(dra_sim.dra.dra_nodes)
    assert dra_nodes == ["gpu-node-0002", "gpu-node-0004", "gpu-node-0006", "gpu-node-0008"]
    for node in core.list_node().items:
        name = node.metadata.name
        gpu_resources = {k for k in node.status.allocatable if k.startswith("nvidia.com/")}
        slices = pool(resource, name)
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
        apps = {p.metadata.labels.get("app") for p in pods}
        if name not in dra_nodes:
            assert gpu_resources and not slices
            assert "nvidia-device-plugin-daemonset" in apps
            continue
        assert not gpu_resources, f"{name} must advertise no nvidia.com resource: {gpu_resources}"
        assert node.metadata.labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
        assert "nvidia-device-plugin-daemonset" not in apps
        plugin = [p for p in pods if p.metadata.namespace == PLUGIN_NAMESPACE]
        assert [p.metadata.labels["dra-driver-nvidia-gpu-component"] for p in plugin] == ["kubelet-plugin"]
        (only,) = slices
        assert only.metadata.name.startswith(f"00000-gpu.nvidia.com-{name}-")
        assert (only.spec.pool.name, only.spec.pool.generation, only.spec.pool.resource_slice_count) == (name, 1, 1)
        assert only.metadata.owner_references[0].kind == "Node"
        hardware = dra_sim.nodes[name]
        expected = []
        for gpu in hardware.gpus:
            expected += [f"gpu-{gpu.index}"] if not gpu.mig_enabled else [None] * len(gpu.mig_devices)
        assert len(only.spec.devices) == len(expected)
        for device in only.spec.devices:
            attrs = device.attributes
            if attrs["type"].string == "gpu":
                assert set(attrs) == GPU_KEYS
                assert device.capacity["memory"].value == f"{hardware.product.memory_mib}Mi"
                gpu = hardware.gpus[int(device.name.split("-")[1])]
                assert attrs["uuid"].string == gpu.uuid and not gpu.mig_enabled
            else:
                assert MIG_NAME.match(device.name), device.name
                assert set(attrs) == GPU_KEYS | {"parentUUID", "profile"}
                assert attrs["uuid"].string.startswith("MIG-")


def test_a_mig_change_shows_only_after_the_plugin_restarts_and_keeps_the_generation(dra_sim, resource, core):
    node = "gpu-node-0004"  # A100-80GB, idle, whole GPUs at start
    assert node in dra_sim.find_nodes(mig_capable=True, idle=True)
    (before,) = pool(resource, node)
    core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-balanced"}}}, _content_type=MERGE)
    wait_for(lambda: core.read_node(node).metadata.labels["nvidia.com/mig.config.state"] == "success")
    dra_sim.settle()
    (unchanged,) = pool(resource, node)
    assert unchanged.metadata.resource_version == before.metadata.resource_version  # discovery only at start
    old_pod = dra_sim.dra.plugin_pod(node)["metadata"]["name"]
    stream = watch.Watch().stream(
        resource.list_resource_slice,
        field_selector=f"spec.nodeName={node}",
        resource_version=before.metadata.resource_version,
        timeout_seconds=5,
    )
    dra_sim.restart_dra_plugin(node)
    event = next(stream)
    assert event["type"] == "MODIFIED"
    after = event["object"]
    assert after.metadata.name == before.metadata.name
    assert after.spec.pool.generation == 1  # one slice updated in place: the controller keeps the generation
    migs = dra_sim.state(node)["gpus"]
    uuids = {d["uuid"] for gpu in migs for d in gpu["mig_devices"]}
    assert {d.attributes["uuid"].string for d in after.spec.devices} == uuids
    assert all(MIG_NAME.match(d.name) for d in after.spec.devices)
    assert dra_sim.dra.plugin_pod(node)["metadata"]["name"] != old_pod


def test_claim_template_is_allocated_by_cel_selectors_and_released_with_its_pod(dra_sim, resource, core):
    node = "gpu-node-0002"  # H100, whole GPUs at start
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-hoppers"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "count": 2,
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": "device.attributes['gpu.nvidia.com'].architecture == "
                                            "'Hopper' && device.capacity['gpu.nvidia.com'].memory"
                                            ".compareTo(quantity('40Gi')) >= 0"
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    resource.create_namespaced_resource_claim_template("research", template)
    pod = dra_sim.add_dra_pod(
        "research", "trainer-0", claims=[{"name": "gpus", "resourceClaimTemplateName": "two-hoppers"}], node=node
    )
    assert pod["status"]["phase"] == "Running" and pod["spec"]["nodeName"] == node
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = resource.read_namespaced_resource_claim(status["resourceClaimName"], "research")
    assert claim.metadata.name.startswith("trainer-0-gpus-")
    results = claim.status.allocation.devices.results
    assert [(r.driver, r.pool, r.request) for r in results] == [("gpu.nvidia.com", node, "gpu")] * 2
    assert [r.device for r in results] == ["gpu-0", "gpu-1"]
    assert [(r.resource, r.name) for r in claim.status.reserved_for] == [("pods", "trainer-0")]
    second = dra_sim.add_dra_pod(
        "research", "trainer-1", claims=[{"name": "gpus", "resourceClaimTemplateName": "two-hoppers"}], node=node
    )
    taken = resource.read_namespaced_resource_claim(
        second["status"]["resourceClaimStatuses"][0]["resourceClaimName"], "research"
    )
    assert [r.device for r in taken.status.allocation.devices.results] == ["gpu-2", "gpu-3"]
    core.delete_namespaced_pod("trainer-0", "research")
    wait_for(
        lambda: (
            not [
                c
                for c in resource.list_namespaced_resource_claim("research").items
                if c.metadata.name == claim.metadata.name
            ]
        )
    )


def test_a_selector_nothing_matches_or_that_fails_leaves_the_pod_pending_with_the_reason(dra_sim, resource):
    claim = {
        "metadata": {"name": "a-b300"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B300'"
                                    }
                                }
                            ],
                        },
                    }
                ]
            }
        },
    }
    resource.create_namespaced_resource_claim("inference", claim)
    pod = dra_sim.add_dra_pod("inference", "wants-b300", claims=[{"name": "gpu", "resourceClaimName": "a-b300"}])
    assert pod["status"]["phase"] == "Pending"
    (condition,) = pod["status"]["conditions"]
    assert condition["reason"] == "Unschedulable" and "0 free match" in condition["message"]
    assert resource.read_namespaced_resource_claim("a-b300", "inference").status is None  # never allocated
    claim["metadata"]["name"] = "no-such-key"
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].nosuchkey == 'x'"}}
    ]
    resource.create_namespaced_resource_claim("inference", claim)
    pod = dra_sim.add_dra_pod("inference", "no-such-key", claims=[{"name": "gpu", "resourceClaimName": "no-such-key"}])
    assert "CEL runtime error" in pod["status"]["conditions"][0]["message"]


def test_an_expression_that_does_not_compile_is_refused_as_the_api_server_does(resource):
    claim = {
        "metadata": {"name": "broken"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [{"cel": {"expression": "device.driver =="}}],
                        },
                    }
                ]
            }
        },
    }
    with pytest.raises(ApiException) as refused:
        resource.create_namespaced_resource_claim("inference", claim)
    assert refused.value.status == 422 and "compilation failed" in refused.value.body
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = []
    claim["spec"]["devices"]["requests"].append(claim["spec"]["devices"]["requests"][0])
    with pytest.raises(ApiException) as twice:
        resource.create_namespaced_resource_claim("inference", claim)
    assert "spec.devices.requests[1].name: Duplicate value" in twice.value.body


def test_nvidia_com_gpu_limits_are_served_through_the_extended_resource_claim(dra_sim, resource):
    pod = dra_sim.add_dra_pod("ml-training", "ext-0", gpus=2, node="gpu-node-0002")
    assert pod["status"]["phase"] == "Running"
    mapping = pod["status"]["extendedResourceClaimStatus"]
    assert mapping["requestMappings"] == [
        {"containerName": "main", "requestName": "container-0-request-0", "resourceName": "nvidia.com/gpu"}
    ]
    claim = resource.read_namespaced_resource_claim(mapping["resourceClaimName"], "ml-training")
    assert claim.metadata.annotations["resource.kubernetes.io/extended-resource-claim"] == "true"
    assert claim.metadata.owner_references[0].name == "ext-0"
    assert len(claim.status.allocation.devices.results) == 2


@pytest.mark.kubectl
def test_kubectl_lists_creates_and_reads_dra_objects(dra_sim, tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is required in CI")
        pytest.skip("kubectl is not installed")

    def run(*args: str, stdin: str | None = None) -> str:
        command = [kubectl, "--kubeconfig", dra_sim.kubeconfig_path, "--cache-dir", str(tmp_path / "c"), *args]
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    listed = {
        line.split()[0] for line in run("api-resources", "--api-group=resource.k8s.io", "--no-headers").splitlines()
    }
    assert listed == {"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"}
    table = [line.split() for line in run("get", "resourceslices").splitlines()]
    assert table[0] == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert sorted(row[1] for row in table[1:]) == sorted(dra_sim.dra.dra_nodes)
    assert all(row[2] == "gpu.nvidia.com" and row[3] == row[1] for row in table[1:])
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "from-kubectl", "namespace": "research"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
    }
    assert "created" in run("create", "--validate=false", "-f", "-", stdin=json.dumps(claim))
    stored = json.loads(run("get", "resourceclaim", "from-kubectl", "-n", "research", "-o", "json"))
    assert stored["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "mig.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 1,
    }
    assert run("get", "resourceclaims", "-n", "research", "from-kubectl", "--no-headers").split()[1] == "pending"
