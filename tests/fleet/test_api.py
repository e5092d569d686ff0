"""The fleet API: lists, filters, details, writes through the services, role denial and query bounds."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import include, path
from django.utils import timezone
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from core import services as core_services
from fleet.models import Cluster, Node, NodePool
from tests.factories import ClusterFactory, GpuFactory, MigDeviceFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db

LIST_PATHS = ["/api/v1/clusters/", "/api/v1/node-pools/", "/api/v1/nodes/", "/api/v1/gpus/", "/api/v1/mig-devices/"]


@pytest.fixture
def fleet():
    """East: a pool with a MIG node, a stale node with an unhealthy A100 outside any pool, a gone node; west: one
    time-sliced node; spare: nothing yet."""
    now = timezone.now()
    east = ClusterFactory(name="east")
    west = ClusterFactory(name="west", driver="agent", kubeconfig_path="")
    spare = ClusterFactory(name="spare", driver="agent", kubeconfig_path="")
    inference = NodePoolFactory(cluster=east, name="inference")
    mig_node = NodeFactory(cluster=east, pool=inference, name="east-a", observed_mode="mig")
    mig_gpu = GpuFactory(
        node=mig_node,
        index=0,
        uuid="GPU-aaaa",
        pci_bus_id="00000000:3B:00.0",
        mig_enabled=True,
        utilization_pct=10.0,
        metrics_at=now,
        last_xid=13,
        last_xid_at=now - timedelta(hours=1),
    )
    MigDeviceFactory(gpu=mig_gpu, profile="3g.40gb", start=0, size=4, uuid="MIG-0", in_use_by="ml/train-0")
    MigDeviceFactory(gpu=mig_gpu, profile="1g.10gb", start=6, size=1, uuid="MIG-1")
    GpuFactory(node=mig_node, index=1, uuid="GPU-aaab", utilization_pct=30.0)
    stale_node = NodeFactory(
        cluster=east, name="east-b", last_seen_at=now - timedelta(hours=1), config_state="failed", ready=False
    )
    GpuFactory(node=stale_node, index=0, uuid="GPU-bbbb", product="NVIDIA-A100-SXM4-40GB", health="unhealthy")
    GpuFactory(node=stale_node, index=1, uuid="GPU-bbbc", product="NVIDIA-A100-SXM4-40GB", gone_at=now)
    gone_node = NodeFactory(cluster=east, name="east-gone", gone_at=now)
    west_node = NodeFactory(cluster=west, name="west-a", observed_mode="time_slicing")
    GpuFactory(node=west_node, index=0, uuid="GPU-cccc", utilization_pct=90.0)
    return {
        "east": east,
        "west": west,
        "spare": spare,
        "inference": inference,
        "mig_node": mig_node,
        "mig_gpu": mig_gpu,
        "stale_node": stale_node,
        "gone_node": gone_node,
        "west_node": west_node,
    }


def names(response, key="name"):
    assert response.status_code == 200, response.data
    return [item[key] for item in response.data["results"]]


def assert_error(response, status, field=None):
    """The one error shape, with a message for `field` when given."""
    assert response.status_code == status, response.data
    assert set(response.data) == {"message", "errors"}
    assert response.data["message"]
    if field:
        assert response.data["errors"][field], response.data


# --- clusters ------------------------------------------------------------------------------------------------------


def test_cluster_list_shows_health_and_counts_but_never_the_kubeconfig(viewer_api, fleet):
    response = viewer_api.get("/api/v1/clusters/")
    east = response.data["results"][0]
    assert names(response) == ["east", "spare", "west"]
    assert (east["node_count"], east["pool_count"]) == (2, 1)  # the gone node does not count
    assert {"connection_state", "last_contact_at", "last_error", "last_error_at"} <= set(east)
    assert east["url"].endswith(f"/api/v1/clusters/{fleet['east'].pk}/")
    assert "kubeconfig_path" not in east


def test_cluster_detail_never_shows_the_kubeconfig(viewer_api, fleet):
    response = viewer_api.get(f"/api/v1/clusters/{fleet['east'].pk}/")
    assert response.data["name"] == "east"
    assert "kubeconfig_path" not in response.data


@pytest.mark.parametrize(
    ("query", "expected"),
    [("driver=agent", ["spare", "west"]), ("q=eas", ["east"]), ("ordering=-name", ["west", "spare", "east"])],
)
def test_cluster_filters(viewer_api, fleet, query, expected):
    assert names(viewer_api.get(f"/api/v1/clusters/?{query}")) == expected


def test_cluster_shows_what_its_cluster_policy_says_and_refuses_to_have_it_written(admin_api, fleet):
    east = fleet["east"]
    Cluster.objects.filter(pk=east.pk).update(
        mig_strategy="mixed", device_plugin_version="v0.17.0", cluster_policy_read_at=timezone.now()
    )
    data = admin_api.get(f"/api/v1/clusters/{east.pk}/").data
    assert (data["mig_strategy"], data["device_plugin_version"]) == ("mixed", "v0.17.0")
    assert data["mps_honours_fail_false"] is False and data["cluster_policy_read_at"]
    patch = {"mig_strategy": "single", "device_plugin_version": "v0.20.0"}
    assert admin_api.patch(f"/api/v1/clusters/{east.pk}/", patch, format="json").status_code == 200
    east.refresh_from_db()
    assert (east.mig_strategy, east.device_plugin_version) == ("mixed", "v0.17.0")  # read-only: the policy decides
    unread = admin_api.get(f"/api/v1/clusters/{fleet['west'].pk}/").data
    assert (unread["mig_strategy"], unread["mps_honours_fail_false"], unread["cluster_policy_read_at"]) == (
        "",
        None,
        None,
    )


def test_admin_creates_and_updates_a_cluster_without_the_kubeconfig_coming_back(admin_api):
    payload = {"name": "lab", "driver": "kubernetes", "kubeconfig_path": "lab.yaml"}  # in KUBECONFIG_DIR
    created = admin_api.post("/api/v1/clusters/", payload, format="json")
    assert created.status_code == 201, created.data
    assert "kubeconfig_path" not in created.data
    assert (created.data["node_count"], created.data["pool_count"]) == (0, 0)

    updated = admin_api.patch(f"/api/v1/clusters/{created.data['id']}/", {"description": "GPU lab"}, format="json")
    assert updated.status_code == 200, updated.data
    assert "kubeconfig_path" not in updated.data
    cluster = Cluster.objects.get(pk=created.data["id"])
    assert (cluster.description, cluster.kubeconfig_path) == ("GPU lab", "lab.yaml")


def test_kubernetes_cluster_without_credentials_is_a_400(admin_api):
    response = admin_api.post("/api/v1/clusters/", {"name": "lab", "driver": "kubernetes"}, format="json")
    assert_error(response, 400, "non_field_errors")
    assert response.data["message"] == "A Kubernetes cluster needs a kubeconfig path or in-cluster credentials."
    assert not Cluster.objects.exists()


def test_cluster_update_that_drops_credentials_is_a_400(admin_api, fleet):
    response = admin_api.patch(f"/api/v1/clusters/{fleet['east'].pk}/", {"kubeconfig_path": ""}, format="json")
    assert_error(response, 400, "non_field_errors")


def test_duplicate_cluster_name_is_a_400_on_the_field(admin_api, fleet):
    response = admin_api.post("/api/v1/clusters/", {"name": "east", "driver": "agent"}, format="json")
    assert_error(response, 400, "name")
    assert response.data["message"].startswith("Invalid input: name:")


def test_bad_field_values_get_a_message_per_field(admin_api):
    response = admin_api.post("/api/v1/clusters/", {"name": "", "driver": "ssh"}, format="json")
    assert_error(response, 400)
    assert set(response.data["errors"]) == {"name", "driver"}


def test_deleting_a_cluster_with_nodes_is_a_409(admin_api, fleet):
    response = admin_api.delete(f"/api/v1/clusters/{fleet['east'].pk}/")
    assert_error(response, 409)
    assert "still has 3 nodes" in response.data["message"]


def test_deleting_an_empty_cluster(admin_api):
    cluster = ClusterFactory()
    assert admin_api.delete(f"/api/v1/clusters/{cluster.pk}/").status_code == 204
    assert not Cluster.objects.exists()


@pytest.fixture(scope="module")
def fleet_schema():
    """The OpenAPI schema of the fleet endpoints alone; generating it must not warn."""
    GENERATOR_STATS.reset()
    schema = SchemaGenerator(patterns=[path("api/v1/", include("fleet.api.urls"))]).get_schema(
        request=None, public=True
    )
    assert not GENERATOR_STATS, "drf-spectacular warned about a fleet endpoint"
    return schema


def test_openapi_cluster_responses_never_document_the_kubeconfig(fleet_schema):
    components = fleet_schema["components"]["schemas"]

    def referenced(node):
        if isinstance(node, dict):
            if "$ref" in node:
                name = node["$ref"].rsplit("/", 1)[-1]
                yield name
                yield from referenced(components[name])
            for value in node.values():
                yield from referenced(value)
        elif isinstance(node, list):
            for value in node:
                yield from referenced(value)

    paths = fleet_schema["paths"]
    operations = [op for route, ops in paths.items() if route.startswith("/api/v1/clusters/") for op in ops.values()]
    response_components = {name for op in operations for name in referenced(op["responses"])}
    assert "Cluster" in response_components
    assert not [name for name in response_components if "kubeconfig_path" in components[name].get("properties", {})]
    assert "kubeconfig_path" in components["ClusterRequest"]["properties"]


def test_openapi_documents_the_row_built_gpu_list(fleet_schema):
    listed = fleet_schema["paths"]["/api/v1/gpus/"]["get"]
    page = fleet_schema["components"]["schemas"]["PaginatedGpuList"]
    assert page["properties"]["results"]["items"] == {"$ref": "#/components/schemas/Gpu"}
    assert {"q", "pool", "stale", "gone", "ordering", "page_size"} <= {p["name"] for p in listed["parameters"]}


# --- node pools ------------------------------------------------------------------------------------------------------


def test_pool_list_and_filters(viewer_api, fleet):
    NodePoolFactory(cluster=fleet["west"], name="training")
    response = viewer_api.get("/api/v1/node-pools/")
    assert names(response) == ["inference", "training"]
    inference = response.data["results"][0]
    assert inference["node_count"] == 1
    assert inference["cluster"]["name"] == "east"
    assert inference["cluster"]["url"].endswith(f"/api/v1/clusters/{fleet['east'].pk}/")
    assert names(viewer_api.get(f"/api/v1/node-pools/?cluster={fleet['west'].pk}")) == ["training"]
    assert names(viewer_api.get("/api/v1/node-pools/?cluster_name=east")) == ["inference"]
    assert names(viewer_api.get("/api/v1/node-pools/?q=train")) == ["training"]


def test_admin_creates_a_selector_pool_and_its_nodes_join(admin_api, fleet, django_capture_on_commit_callbacks):
    Node.objects.filter(pk=fleet["stale_node"].pk).update(labels={"tessera.io/pool": "batch"})
    payload = {"cluster": fleet["east"].pk, "name": "batch", "node_selector": "tessera.io/pool=batch"}
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_api.post("/api/v1/node-pools/", payload, format="json")
    assert response.status_code == 201, response.data
    assert response.data["cluster"]["id"] == fleet["east"].pk
    assert admin_api.get(response.data["url"]).data["node_count"] == 1  # joined after commit, by the worker


def test_pool_update_keeps_its_cluster(admin_api, fleet):
    url = f"/api/v1/node-pools/{fleet['inference'].pk}/"
    response = admin_api.put(url, {"name": "serving", "cluster": fleet["west"].pk}, format="json")
    assert_error(response, 400, "cluster")  # refused, no longer ignored (issue 25, point 5)
    fleet["inference"].refresh_from_db()
    assert (fleet["inference"].name, fleet["inference"].cluster) == ("inference", fleet["east"])


def test_bad_label_selector_is_a_400_on_the_field(admin_api, fleet):
    payload = {"cluster": fleet["east"].pk, "name": "bad", "node_selector": "a in b"}
    response = admin_api.post("/api/v1/node-pools/", payload, format="json")
    assert_error(response, 400, "node_selector")
    assert not NodePool.objects.filter(name="bad").exists()


def test_duplicate_pool_name_in_a_cluster_is_a_400(admin_api, fleet):
    payload = {"cluster": fleet["east"].pk, "name": "inference"}
    assert_error(admin_api.post("/api/v1/node-pools/", payload, format="json"), 400, "non_field_errors")
    other = NodePoolFactory(cluster=fleet["east"], name="other")
    response = admin_api.patch(f"/api/v1/node-pools/{other.pk}/", {"name": "inference"}, format="json")
    assert_error(response, 400, "non_field_errors")


def test_unknown_cluster_for_a_pool_is_a_400(admin_api):
    assert_error(admin_api.post("/api/v1/node-pools/", {"cluster": 999, "name": "x"}, format="json"), 400, "cluster")


def test_deleting_a_pool_leaves_its_nodes_without_one(admin_api, fleet):
    assert admin_api.delete(f"/api/v1/node-pools/{fleet['inference'].pk}/").status_code == 204
    fleet["mig_node"].refresh_from_db()
    assert fleet["mig_node"].pool is None


def test_pool_members_are_listed_and_replaced(admin_api, viewer_api, fleet):
    url = f"/api/v1/node-pools/{fleet['inference'].pk}/members/"
    assert [n["name"] for n in viewer_api.get(url).data["nodes"]] == ["east-a"]

    response = admin_api.post(url, {"nodes": [fleet["stale_node"].pk]}, format="json")
    assert response.status_code == 200, response.data
    assert response.data["nodes"] == [
        {
            "id": fleet["stale_node"].pk,
            "name": "east-b",
            "url": f"http://testserver/api/v1/nodes/{fleet['stale_node'].pk}/",
        }
    ]
    fleet["mig_node"].refresh_from_db()
    assert fleet["mig_node"].pool is None


@pytest.mark.parametrize(
    "nodes",
    [lambda f: [f["west_node"].pk], lambda f: [f["gone_node"].pk], lambda f: [999_999], lambda f: "abc"],
    ids=["other-cluster", "gone", "unknown", "not-a-list"],
)
def test_pool_members_refused(admin_api, fleet, nodes):
    url = f"/api/v1/node-pools/{fleet['inference'].pk}/members/"
    assert_error(admin_api.post(url, {"nodes": nodes(fleet)}, format="json"), 400, "nodes")


def test_members_of_a_selector_pool_cannot_be_set(admin_api, fleet):
    pool = NodePoolFactory(cluster=fleet["east"], node_selector="tessera.io/pool=x")
    response = admin_api.post(f"/api/v1/node-pools/{pool.pk}/members/", {"nodes": []}, format="json")
    assert_error(response, 400, "nodes")


# --- roles -----------------------------------------------------------------------------------------------------------

WRITES = [
    ("post", "/api/v1/clusters/", {"name": "x", "driver": "agent"}),
    ("patch", "/api/v1/clusters/{east}/", {"description": "x"}),
    ("delete", "/api/v1/clusters/{spare}/", None),
    ("post", "/api/v1/node-pools/", {"cluster": "{east}", "name": "x"}),
    ("patch", "/api/v1/node-pools/{inference}/", {"description": "x"}),
    ("delete", "/api/v1/node-pools/{inference}/", None),
    ("post", "/api/v1/node-pools/{inference}/members/", {"nodes": []}),
]


def _write(client, fleet, method, path, payload):
    ids = {key: obj.pk for key, obj in fleet.items()}
    # "{east}" is the id itself, a JSON number (a string would be refused: issue 25, point 5)
    payload = {key: ids.get(str(value).strip("{}"), value) for key, value in (payload or {}).items()}
    return getattr(client, method)(path.format(**ids), payload, format="json")


@pytest.mark.parametrize(("method", "path", "payload"), WRITES)
@pytest.mark.parametrize("client_name", ["viewer_api", "operator_api"])
def test_viewers_and_operators_cannot_change_clusters_or_pools(request, fleet, client_name, method, path, payload):
    response = _write(request.getfixturevalue(client_name), fleet, method, path, payload)
    assert_error(response, 403)


@pytest.mark.parametrize(("method", "path", "payload"), WRITES)
def test_admins_can_change_clusters_and_pools(admin_api, fleet, method, path, payload):
    assert _write(admin_api, fleet, method, path, payload).status_code in (200, 201, 204)


@pytest.mark.parametrize("path", LIST_PATHS)
def test_anonymous_gets_401_in_the_error_shape(api_client, path):
    response = api_client.get(path)
    assert_error(response, 401)
    assert response["WWW-Authenticate"].startswith("Token")


@pytest.mark.parametrize("path", ["/api/v1/nodes/", "/api/v1/gpus/", "/api/v1/mig-devices/"])
def test_observed_inventory_is_read_only_even_for_admins(admin_api, path):
    assert_error(admin_api.post(path, {}, format="json"), 405)


def test_token_authentication(fleet, viewer):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {core_services.api_token_rotate(user=viewer)[1]}")
    assert client.get("/api/v1/gpus/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert_error(client.get("/api/v1/gpus/"), 401)


def test_unknown_id_is_a_404_in_the_error_shape(viewer_api):
    assert_error(viewer_api.get("/api/v1/gpus/999999/"), 404)
    assert_error(viewer_api.get("/api/v1/nodes/abc/"), 404)


# --- nodes -----------------------------------------------------------------------------------------------------------


def test_node_list_summarises_live_gpus(viewer_api, fleet):
    response = viewer_api.get("/api/v1/nodes/")
    assert names(response) == ["east-a", "east-b", "west-a"]
    east_a, east_b, _ = response.data["results"]
    assert (east_a["gpu_count"], east_a["mean_utilization"], east_a["product"]) == (2, 20.0, "NVIDIA-H100-80GB-HBM3")
    assert (east_b["gpu_count"], east_b["unhealthy_gpu_count"]) == (1, 1)
    assert (east_a["stale"], east_b["stale"]) == (False, True)
    assert east_a["pool"]["name"] == "inference"
    assert east_b["pool"] is None
    assert east_a["cluster"] == {
        "id": fleet["east"].pk,
        "name": "east",
        "url": f"http://testserver/api/v1/clusters/{fleet['east'].pk}/",
    }


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("cluster={west}", ["west-a"]),
        ("cluster_name=east", ["east-a", "east-b"]),
        ("pool={inference}", ["east-a"]),
        ("pool=none", ["east-b", "west-a"]),
        ("product=NVIDIA-H100-80GB-HBM3", ["east-a", "west-a"]),  # east-a has two: listed once
        ("product=NVIDIA-A100-SXM4-40GB", ["east-b"]),
        ("mig_enabled=true", ["east-a"]),
        ("mig_enabled=false", ["east-b", "west-a"]),
        ("mig_capable=true", ["east-a", "east-b", "west-a"]),
        ("mode=time_slicing", ["west-a"]),
        ("unhealthy=true", ["east-b"]),
        ("unhealthy=false", ["east-a", "west-a"]),
        ("stale=true", ["east-b"]),
        ("stale=false", ["east-a", "west-a"]),
        ("config_state=failed", ["east-b"]),
        ("ready=false", ["east-b"]),
        ("gone=true", ["east-gone"]),
        ("q=west", ["west-a"]),
        ("q=GPU-BBBB", ["east-b"]),
        ("q=3B:00", ["east-a"]),
        ("ordering=-name", ["west-a", "east-b", "east-a"]),
        ("ordering=-cluster,name", ["west-a", "east-a", "east-b"]),
    ],
)
def test_node_filters(viewer_api, fleet, query, expected):
    ids = {key: obj.pk for key, obj in fleet.items()}
    assert names(viewer_api.get(f"/api/v1/nodes/?{query.format(**ids)}")) == expected


@pytest.mark.parametrize("query", ["config_state=done", "mode=vgpu", "pool=123456", "ordering=labels", "cluster=abc"])
def test_bad_filter_values_are_a_400(viewer_api, fleet, query):
    assert_error(viewer_api.get(f"/api/v1/nodes/?{query}"), 400, query.split("=")[0])


def test_gone_node_detail_is_still_found(viewer_api, fleet):
    response = viewer_api.get(f"/api/v1/nodes/{fleet['gone_node'].pk}/")
    assert response.status_code == 200
    assert response.data["gone_at"] is not None


# --- GPUs ------------------------------------------------------------------------------------------------------------


def test_gpu_list_item_is_exactly_the_detail(viewer_api, fleet):
    gpu = fleet["mig_gpu"]
    listed = viewer_api.get("/api/v1/gpus/?q=GPU-aaaa").data["results"]
    detail = viewer_api.get(f"/api/v1/gpus/{gpu.pk}/").data
    assert listed == [detail]
    assert detail["node"]["name"] == "east-a"
    assert (detail["cluster"]["name"], detail["pool"]["name"]) == ("east", "inference")
    assert detail["metrics_at"].endswith("Z")
    assert detail["mig_devices"] == [
        {
            "id": detail["mig_devices"][0]["id"],
            "profile": "3g.40gb",
            "start": 0,
            "size": 4,
            "uuid": "MIG-0",
            "dra_device": "",
            "in_use_by": "ml/train-0",
            "utilization_pct": None,
            "memory_used_mib": None,
        },
        {
            "id": detail["mig_devices"][1]["id"],
            "profile": "1g.10gb",
            "start": 6,
            "size": 1,
            "uuid": "MIG-1",
            "dra_device": "",
            "in_use_by": "",
            "utilization_pct": None,
            "memory_used_mib": None,
        },
    ]


def test_gpu_list_without_pool_or_mig(viewer_api, fleet):
    (item,) = viewer_api.get("/api/v1/gpus/?cluster_name=west").data["results"]
    assert (item["pool"], item["mig_devices"], item["memory_mib"]) == (None, [], 81559)
    assert item == viewer_api.get(item["url"]).data


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", ["GPU-aaaa", "GPU-aaab", "GPU-bbbb", "GPU-cccc"]),
        ("product=NVIDIA-A100-SXM4-40GB", ["GPU-bbbb"]),
        ("health=unhealthy", ["GPU-bbbb"]),
        ("mig_enabled=true", ["GPU-aaaa"]),
        ("pool=none", ["GPU-bbbb", "GPU-cccc"]),
        ("pool={inference}", ["GPU-aaaa", "GPU-aaab"]),
        ("cluster={west}", ["GPU-cccc"]),
        ("node={stale_node}", ["GPU-bbbb"]),
        ("mode=mig", ["GPU-aaaa", "GPU-aaab"]),
        ("stale=true", ["GPU-bbbb"]),
        ("config_state=failed", ["GPU-bbbb"]),
        ("ready=false", ["GPU-bbbb"]),
        ("gone=true", ["GPU-bbbc"]),
        ("q=3b:00", ["GPU-aaaa"]),
        ("q=west-a", ["GPU-cccc"]),
        ("ordering=-utilization_pct", ["GPU-cccc", "GPU-bbbb", "GPU-aaab", "GPU-aaaa"]),
    ],
)
def test_gpu_filters(viewer_api, fleet, query, expected):
    ids = {key: obj.pk for key, obj in fleet.items()}
    assert names(viewer_api.get(f"/api/v1/gpus/?{query.format(**ids)}"), key="uuid") == expected


def test_gpu_pagination(viewer_api, fleet):
    first = viewer_api.get("/api/v1/gpus/?page_size=3").data
    assert (first["count"], len(first["results"])) == (4, 3)
    second = viewer_api.get(first["next"]).data
    assert [g["uuid"] for g in second["results"]] == ["GPU-cccc"]
    assert_error(viewer_api.get("/api/v1/gpus/?page=9"), 404)


# --- MIG devices -----------------------------------------------------------------------------------------------------


def test_mig_device_list_detail_and_filters(viewer_api, fleet):
    response = viewer_api.get("/api/v1/mig-devices/")
    assert names(response, key="uuid") == ["MIG-0", "MIG-1"]
    first = response.data["results"][0]
    assert (first["gpu"]["name"], first["node"]["name"]) == ("east-a/gpu0", "east-a")
    assert viewer_api.get(first["url"]).data == first
    assert names(viewer_api.get("/api/v1/mig-devices/?in_use=true"), key="uuid") == ["MIG-0"]
    assert names(viewer_api.get("/api/v1/mig-devices/?profile=1g.10gb"), key="uuid") == ["MIG-1"]
    assert names(viewer_api.get(f"/api/v1/mig-devices/?gpu={fleet['mig_gpu'].pk}&ordering=-start"), key="uuid") == [
        "MIG-1",
        "MIG-0",
    ]
    assert names(viewer_api.get(f"/api/v1/mig-devices/?cluster={fleet['west'].pk}"), key="uuid") == []


# --- query bounds ----------------------------------------------------------------------------------------------------


def seed(count):
    """`count` clusters, each with a pool, a node in it and two GPUs, one of them with two MIG devices."""
    for _ in range(count):
        pool = NodePoolFactory()
        node = NodeFactory(cluster=pool.cluster, pool=pool)
        gpu = GpuFactory(node=node, index=0, mig_enabled=True)
        GpuFactory(node=node, index=1)
        MigDeviceFactory(gpu=gpu, start=0)
        MigDeviceFactory(gpu=gpu, start=1)


def count_queries(client, url):
    client.get(url)  # the caller's role is looked up once, then cached on the user
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries), response.data["count"]


@pytest.mark.parametrize("path", LIST_PATHS)
def test_list_queries_do_not_grow_with_rows(viewer_api, path):
    seed(3)
    few, few_rows = count_queries(viewer_api, f"{path}?page_size=100")
    seed(27)
    many, many_rows = count_queries(viewer_api, f"{path}?page_size=100")
    assert many_rows >= 30 > few_rows
    assert many == few <= 4


@pytest.mark.parametrize("query", ["", "&cluster={cluster}&pool={pool}&stale=false&q=gpu&ordering=-utilization_pct"])
def test_gpu_page_of_500_takes_at_most_8_queries_with_token_auth(viewer, query):
    seed(30)
    pool = NodePool.objects.first()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {core_services.api_token_rotate(user=viewer)[1]}")
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/api/v1/gpus/?page_size=500{query.format(cluster=pool.cluster_id, pool=pool.pk)}")
    assert response.status_code == 200
    assert len(response.data["results"]) == (60 if not query else 2)
    assert len(queries) <= 8
