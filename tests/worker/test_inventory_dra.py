"""Inventory of a cluster mixing device-plugin nodes and nodes served by NVIDIA's DRA driver (the simulator's
--dra-nodes mixed), over real HTTPS: the GPU stack each node runs is read, stored, and left alone by node events."""

import pytest
from django.urls import reverse

from fleet.models import Gpu, Node
from fleet.services import inventory_record
from worker.inventory.cluster import sync_cluster_full
from worker.inventory.nodes import node_observation


@pytest.fixture
def sim_options():
    return {"nodes": 6, "dra_nodes": "mixed"}


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
    assert "Device plugin (ClusterPolicy): 3" in page and "NVIDIA DRA driver (ClusterPolicy): 3" in page
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
