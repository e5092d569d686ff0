"""Inventory of a cluster mixing device-plugin nodes and nodes served by NVIDIA's DRA driver (the simulator's
--dra-nodes mixed), over real HTTPS: the GPU stack each node runs is read, stored, and left alone by node events."""

import pytest
from django.urls import reverse

from fleet.models import Gpu, MigDevice, Node, PendingPod, Pod
from fleet.services import inventory_record
from simulator.resources import RESOURCE_CLAIM_TEMPLATES
from tests.processes import wait_until
from tests.worker.test_inventory import Running
from worker.inventory.cluster import scrape_metrics, sync_cluster_full
from worker.inventory.nodes import node_observation
from worker.inventory.pods import sync_pods

MERGE = "application/merge-patch+json"
MIG_NODE, MIG_CLASS = "gpu-node-0008", "mig.nvidia.com"  # H100 on all-1g.10gb at start
GPU_CLASS = "gpu.nvidia.com"


@pytest.fixture
def sim_options():
    return {"nodes": 8, "dra_nodes": "mixed"}


@pytest.mark.django_db
def test_full_sync_stores_each_nodes_gpu_stack(sim, sim_cluster):
    sync_cluster_full(sim_cluster, gpus=False, metrics=False)
    stacks = dict(Node.objects.values_list("name", "gpu_stack"))
    assert stacks == {
        name: "dra_clusterpolicy" if name in sim.dra.dra_nodes else "device_plugin" for name in sorted(sim.nodes)
    }
    dynamic = dict(Node.objects.values_list("name", "dynamic_mig"))
    assert {dynamic[n] for n in sim.dra.dra_nodes} == {False}
    assert {dynamic[n] for n in set(sim.nodes) - sim.dra.dra_nodes} == {None}
    # A node event (the watch's observation, no DRA view) keeps what the full sync read.
    name = sorted(sim.dra.dra_nodes)[0]
    inventory_record(cluster=sim_cluster, nodes=[node_observation(sim.node(name))])
    assert Node.objects.get(name=name).gpu_stack == "dra_clusterpolicy"


@pytest.mark.django_db
def test_cluster_and_node_pages_and_the_api_say_which_stack_each_node_runs(sim, sim_cluster, client, viewer):
    client.force_login(viewer)
    sync_cluster_full(sim_cluster, gpus=False, metrics=False)
    page = client.get(reverse("fleet:cluster_detail", args=[sim_cluster.pk])).content.decode()
    assert "Device plugin (ClusterPolicy): 4" in page and "NVIDIA DRA driver (ClusterPolicy): 4" in page
    dra = Node.objects.get(name=sorted(sim.dra.dra_nodes)[0])
    node_page = client.get(reverse("console:node_detail", args=[dra.pk])).content.decode()
    assert "NVIDIA DRA driver (ClusterPolicy)" in node_page and "DynamicMIG off" in node_page
    assert 'id="dra-assumption"' in node_page  # what the page's sharing fields assumed
    plugin = Node.objects.exclude(pk=dra.pk).filter(gpu_stack="device_plugin").first()
    assert 'id="dra-assumption"' not in client.get(reverse("console:node_detail", args=[plugin.pk])).content.decode()
    listed = client.get("/api/v1/nodes/?gpu_stack=dra_clusterpolicy").json()
    assert sorted(n["name"] for n in listed["results"]) == sorted(sim.dra.dra_nodes)
    assert {(n["gpu_stack"], n["dynamic_mig"]) for n in listed["results"]} == {("dra_clusterpolicy", False)}


@pytest.mark.django_db
def test_a_preview_says_it_assumed_the_device_plugin_on_dra_nodes(sim, sim_cluster, admin_api, viewer_api):
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    products = sorted(set(Gpu.objects.values_list("product", flat=True)))
    profile = {"name": "whole", "mode": "passthrough", "target_products": products}
    created = admin_api.post("/api/v1/profiles/", profile, format="json")
    assert created.status_code == 201, created.json()
    pk = created.json()["id"]
    ids = list(Node.objects.order_by("name").values_list("pk", flat=True))
    body = viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"nodes": ids}, format="json").json()
    by_name = {item["node"]["name"]: item for item in body["nodes"]}
    for name, item in by_name.items():
        if name in sim.dra.dra_nodes:
            assert item["gpu_stack"] == "dra_clusterpolicy"
            assert item["assumption"].startswith("Assumed the device plugin, but NVIDIA's DRA driver serves this node")
        else:
            assert (item["gpu_stack"], item["assumption"]) == ("device_plugin", "")


@pytest.mark.django_db
def test_dra_gpus_and_mig_devices_come_from_the_pool_keyed_by_driver_pool_device(sim, sim_cluster, core):
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    whole = Gpu.objects.filter(node__name="gpu-node-0002").order_by("index")
    assert [g.dra_device for g in whole] == [f"gpu.nvidia.com/gpu-node-0002/gpu-{i}" for i in range(8)]
    assert {g.product for g in whole} == {"NVIDIA-H100-80GB-HBM3"}
    assert [g.uuid for g in whole] == [g.uuid for g in sim.nodes["gpu-node-0002"].gpus]
    # gpu-node-0004 (A100-80GB, a DRA node) goes MIG; the pool shows it once the plugin restarted.
    core.patch_node(
        "gpu-node-0004", {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}}, _content_type=MERGE
    )
    assert sim.settle()
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    assert not MigDevice.objects.filter(gpu__node__name="gpu-node-0004").exists()  # discovery only at plugin start
    sim.restart_dra_plugin("gpu-node-0004")
    assert sim.settle()
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    hardware = {d["uuid"]: d for g in sim.state("gpu-node-0004")["gpus"] for d in g["mig_devices"]}
    stored = MigDevice.objects.filter(gpu__node__name="gpu-node-0004")
    assert {m.uuid for m in stored} == set(hardware) and len(hardware) == 8 * 7
    for m in stored:
        assert (m.profile, m.start, m.size) == ("1g.10gb", hardware[m.uuid]["start"], 1)
        assert m.dra_device == f"gpu.nvidia.com/gpu-node-0004/gpu-{m.gpu.index}-mig-1g10gb-19-{m.start}"
    assert set(Gpu.objects.filter(node__name="gpu-node-0004").values_list("mig_enabled", "dra_device")) == {(True, "")}
    scrape_metrics(sim_cluster)  # dcgm-exporter's view leaves what the slices said
    assert MigDevice.objects.filter(gpu__node__name="gpu-node-0004").exclude(dra_device="").count() == 56
    assert Gpu.objects.get(node__name="gpu-node-0002", index=0).dra_device == "gpu.nvidia.com/gpu-node-0002/gpu-0"


@pytest.mark.django_db(transaction=True)
def test_the_watch_follows_a_pools_new_devices_recording_only_that_node(sim, sim_cluster, core):
    with Running(sim_cluster, gpus_on_start=True) as watcher:
        wait_until(lambda: Gpu.objects.filter(node__name="gpu-node-0006").exclude(dra_device="").count() == 4,
                   timeout=20, message="the listing's DRA GPUs")  # fmt: skip
        core.patch_node(
            "gpu-node-0004", {"metadata": {"labels": {"nvidia.com/mig.config": "all-3g.40gb"}}}, _content_type=MERGE
        )
        assert sim.settle()
        sim.restart_dra_plugin("gpu-node-0004")
        wait_until(lambda: MigDevice.objects.filter(gpu__node__name="gpu-node-0004").count() == 16, timeout=20,
                   message="the new MIG devices of the pool")  # fmt: skip
        assert watcher.stats.lists == 1  # followed by the slice stream, not a re-list
        assert watcher.stats.slice_events >= 1 and watcher.stats.last_batch_pools == 1  # one node changed
    profiles = set(MigDevice.objects.filter(gpu__node__name="gpu-node-0004").values_list("profile", flat=True))
    assert profiles == {"3g.40gb"}


@pytest.mark.django_db
def test_pods_hold_what_their_claims_hold_and_the_preview_names_those_losing_a_slice(
    sim, sim_cluster, admin_api, viewer_api
):
    sim.store.create(
        RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "one-slice", "namespace": "research"},
            "spec": {
                "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}
            },
        },
    )
    mig = sim.add_dra_pod(
        "research",
        "slice-user",
        claims=[{"name": "mig", "resourceClaimTemplateName": "one-slice"}],
        node="gpu-node-0008",
    )
    whole = sim.add_dra_pod("ml-training", "two-gpus", gpus=2, node="gpu-node-0002")
    assert mig["status"]["phase"] == whole["status"]["phase"] == "Running"
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    sync_pods(sim_cluster)
    held = {(p.node.name, p.name): p.gpu_resources for p in Pod.objects.select_related("node")}
    assert held[(MIG_NODE, "slice-user")] == {"nvidia.com/mig-1g.10gb": 1}
    assert held[("gpu-node-0002", "two-gpus")] == {"nvidia.com/gpu": 2}
    products = sorted(set(Gpu.objects.values_list("product", flat=True)))
    created = admin_api.post(
        "/api/v1/profiles/", {"name": "whole", "mode": "passthrough", "target_products": products}, format="json"
    )
    node = Node.objects.get(name=MIG_NODE)
    body = viewer_api.post(f"/api/v1/profiles/{created.json()['id']}/preview/", {"nodes": [node.pk]}, format="json")
    (item,) = body.json()["nodes"]
    assert [(p["namespace"], p["name"]) for p in item["pods_losing"]] == [("research", "slice-user")]


@pytest.mark.django_db
def test_a_preview_refuses_a_dra_node_a_mig_gpu_without_instances(sim, sim_cluster, admin_api, viewer_api):
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    layouts = {"all": {"1g.10gb": 7}, "0": {}}
    created = admin_api.post(
        "/api/v1/profiles/",
        {"name": "holes", "mode": "mig", "target_products": ["NVIDIA-H100-80GB-HBM3"], "mig_layouts": layouts},
        format="json",
    )
    if created.status_code != 201:
        pytest.skip(f"profiles refuse an empty per-GPU layout already: {created.json()}")
    ids = list(Node.objects.filter(name__in=["gpu-node-0002", "gpu-node-0005"]).values_list("pk", flat=True))
    body = viewer_api.post(f"/api/v1/profiles/{created.json()['id']}/preview/", {"nodes": ids}, format="json").json()
    errors = {item["node"]["name"]: item["errors"] for item in body["nodes"]}
    assert any("GPU 0: MIG mode on with no MIG instance" in e for e in errors["gpu-node-0002"])  # a DRA node
    assert not any("no MIG instance" in e for e in errors["gpu-node-0005"])  # the device plugin keeps such a GPU


@pytest.mark.django_db
def test_pods_waiting_on_claims_for_whole_gpus_are_demand(sim, sim_cluster):
    nine = {"deviceClassName": GPU_CLASS, "count": 9}
    sim.store.create(
        RESOURCE_CLAIM_TEMPLATES,
        {
            "metadata": {"name": "nine-gpus", "namespace": "ml-training"},
            "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": nine}]}}},
        },
    )
    waiting = sim.add_dra_pod(
        "ml-training", "too-big", claims=[{"name": "g", "resourceClaimTemplateName": "nine-gpus"}]
    )
    assert waiting["status"]["phase"] == "Pending"  # no node has nine GPUs
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    sync_pods(sim_cluster)
    assert dict(PendingPod.objects.values_list("name", "gpu_resources")) == {"too-big": {"nvidia.com/gpu": 9}}


@pytest.mark.django_db
def test_a_preview_refuses_time_slicing_on_dra_nodes_and_a_mig_layout_under_a_gpucluster(
    sim, sim_cluster, admin_api, viewer_api
):
    sync_cluster_full(sim_cluster, gpus=True, metrics=False)
    products = sorted(set(Gpu.objects.values_list("product", flat=True)))
    profile = {"name": "ts", "mode": "time_slicing", "replicas": 4, "target_products": products}
    created = admin_api.post("/api/v1/profiles/", profile, format="json")
    assert created.status_code == 201, created.json()
    ids = list(Node.objects.filter(name__in=["gpu-node-0002", "gpu-node-0005"]).values_list("pk", flat=True))
    body = viewer_api.post(f"/api/v1/profiles/{created.json()['id']}/preview/", {"nodes": ids}, format="json").json()
    errors = {item["node"]["name"]: " ".join(item["errors"]) for item in body["nodes"]}
    assert "shares a GPU per ResourceClaim" in errors["gpu-node-0002"] and not errors["gpu-node-0005"]
    assert body["summary"]["refused"] == 1
    Node.objects.filter(name="gpu-node-0002").update(gpu_stack="dra_gpucluster")
    mig = {
        "name": "m",
        "mode": "mig",
        "target_products": ["NVIDIA-H100-80GB-HBM3"],
        "mig_layouts": {"all": "1g.10gb x7"},
    }
    pk = admin_api.post("/api/v1/profiles/", mig, format="json").json()["id"]
    body = viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"nodes": ids}, format="json").json()
    errors = {item["node"]["name"]: " ".join(item["errors"]) for item in body["nodes"]}
    assert "GPUCluster, which has no MIG Manager" in errors["gpu-node-0002"] and "node agent" in errors["gpu-node-0002"]
    assert not errors["gpu-node-0005"]
