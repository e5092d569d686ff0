"""Sharing API: MIG validation and catalog, profile CRUD with per-field errors, preview, assign, pin, roles."""

import pytest

from sharing.models import NodePin, PoolSharing, SharingProfile
from tests.factories import GpuFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db
H100 = "NVIDIA-H100-80GB-HBM3"
MIG_PROFILE = {"name": "inference-7", "mode": "mig", "target_products": [H100], "mig_layouts": {"all": "1g.10gb x7"}}


def test_mig_validate_answers_valid_with_placements(viewer_api):
    response = viewer_api.post(
        "/api/v1/mig/validate/", {"product": H100, "devices": {"3g.40gb": 1, "4g.40gb": 1}}, format="json"
    )
    assert response.status_code == 200
    body = response.json()
    assert body["valid"] is True
    assert sorted((p["profile"], p["start"], p["size"]) for p in body["placements"]) == [
        ("3g.40gb", 4, 4),
        ("4g.40gb", 0, 4),
    ]
    assert (body["compute_slices_used"], body["memory_slices_used"]) == (7, 8)


def test_mig_validate_explains_refusals_and_rejects_unknown_products(viewer_api):
    refused = viewer_api.post("/api/v1/mig/validate/", {"product": H100, "devices": {"1g.10gb": 8}}, format="json")
    assert refused.status_code == 200
    assert refused.json()["valid"] is False
    assert "NVIDIA-H100-80GB-HBM3 has 7 compute slices; 1g.10gb × 8 needs 8" in refused.json()["errors"]
    unknown = viewer_api.post("/api/v1/mig/validate/", {"product": "H100", "devices": {}}, format="json")
    assert unknown.status_code == 400
    assert "NVIDIA-A30" in unknown.json()["errors"]["product"][0]


def test_mig_products_lists_catalog(viewer_api):
    products = {p["name"]: p for p in viewer_api.get("/api/v1/mig/products/").json()}
    assert products[H100]["mig_capable"] is True
    assert {p["name"] for p in products[H100]["profiles"]} >= {"1g.10gb", "7g.80gb", "1g.10gb+me"}
    assert products["NVIDIA-L4"]["profiles"] == []
    assert products[H100]["pci_device_ids"] == ["0x233010DE"]
    assert products["NVIDIA-A100-PCIE-40GB"]["pci_device_ids"] == ["0x20F110DE", "0x20B110DE"]
    b300 = products["NVIDIA-B300-SXM6-AC"]
    assert b300["figures_estimated"] is True and b300["profiles"][0]["memory_estimated"] is True
    a100 = {p["name"]: p for p in products["NVIDIA-A100-SXM4-40GB"]["profiles"]}
    assert (a100["7g.40gb"]["memory_mib"], a100["7g.40gb"]["memory_estimated"]) == (40192, False)
    rtx = {p["name"]: p for p in products["NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"]["profiles"]}
    assert rtx["1g.24gb+me.all"]["attribute"] == "+me.all"


def test_profile_crud_roles_and_field_errors(admin_api, operator_api, viewer_api, api_client):
    assert api_client.get("/api/v1/profiles/").status_code == 401
    assert operator_api.post("/api/v1/profiles/", MIG_PROFILE, format="json").status_code == 403
    created = admin_api.post("/api/v1/profiles/", MIG_PROFILE, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["mig_layouts"] == {"all": {"1g.10gb": 7}}

    bad = admin_api.post(
        "/api/v1/profiles/", {**MIG_PROFILE, "name": "bad", "mig_layouts": {"all": {"1g.10gb": 8}}}, format="json"
    )
    assert bad.status_code == 400
    assert any("needs 8" in m for m in bad.json()["errors"]["mig_layouts.all"])
    bad_mps = admin_api.post(
        "/api/v1/profiles/", {"name": "m", "mode": "mps", "target_products": [H100], "replicas": 64}, format="json"
    )
    assert bad_mps.status_code == 400 and "at most 48" in bad_mps.json()["errors"]["replicas"][0]
    notation = admin_api.post(
        "/api/v1/profiles/", {**MIG_PROFILE, "name": "x", "mig_layouts": {"all": "1g.10gb x"}}, format="json"
    )
    assert notation.status_code == 400 and "mig_layouts.all" in notation.json()["errors"]

    pk = created.json()["id"]
    assert viewer_api.get(f"/api/v1/profiles/{pk}/").status_code == 200
    assert viewer_api.patch(f"/api/v1/profiles/{pk}/", {"description": "x"}, format="json").status_code == 403
    assert (
        admin_api.patch(f"/api/v1/profiles/{pk}/", {"description": "day"}, format="json").json()["description"] == "day"
    )
    assert admin_api.delete(f"/api/v1/profiles/{pk}/").status_code == 204


def _pool_with_node():
    pool = NodePoolFactory()
    node = NodeFactory(cluster=pool.cluster, pool=pool, allocatable={"nvidia.com/gpu": 2})
    GpuFactory(node=node, index=0, product=H100)
    GpuFactory(node=node, index=1, product=H100)
    return pool, node


def test_preview_assign_and_pin(admin_api, operator_api, viewer_api):
    pool, node = _pool_with_node()
    pk = admin_api.post("/api/v1/profiles/", MIG_PROFILE, format="json").json()["id"]

    preview = viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"pool": pool.pk}, format="json")
    assert preview.status_code == 200
    body = preview.json()
    assert (body["summary"]["nodes"], body["summary"]["resetting"], body["summary"]["gpus_resetting"]) == (1, 1, 2)
    (item,) = body["nodes"]
    assert (item["allocatable_before"], item["allocatable_after"]) == (
        {"nvidia.com/gpu": 2},
        {"nvidia.com/mig-1g.10gb": 14},
    )
    assert item["node"]["name"] == node.name and item["mig_config"].startswith("tessera-mig-")
    by_nodes = viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"nodes": [node.pk]}, format="json")
    assert by_nodes.json()["summary"]["nodes"] == 1
    neither = viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {}, format="json")
    assert neither.status_code == 400 and neither.json()["errors"] == {
        "pool": ["Give either a pool or a list of nodes."]
    }

    assert viewer_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json").status_code == 403
    assert operator_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json").status_code == 200
    assert PoolSharing.objects.get(pool=pool).profile_id == pk

    pinned = operator_api.post(f"/api/v1/profiles/{pk}/pin/", {"nodes": [node.pk], "reason": "test"}, format="json")
    assert pinned.status_code == 200 and pinned.json()[0]["node"]["id"] == node.pk
    pin_id = NodePin.objects.get(node=node).pk
    assert viewer_api.delete(f"/api/v1/node-pins/{pin_id}/").status_code == 403
    assert operator_api.delete(f"/api/v1/node-pins/{pin_id}/").status_code == 204
    assert not NodePin.objects.exists()

    in_use = admin_api.delete(f"/api/v1/profiles/{pk}/")
    assert in_use.status_code == 409 and "in use" in in_use.json()["message"]
    assert SharingProfile.objects.filter(pk=pk).exists()


def test_assign_refuses_profile_that_does_not_fit(admin_api, operator_api):
    pool, _ = _pool_with_node()
    pk = admin_api.post(
        "/api/v1/profiles/", {"name": "a30", "mode": "passthrough", "target_products": ["NVIDIA-A30"]}, format="json"
    ).json()["id"]
    response = operator_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json")
    assert response.status_code == 400
    assert "targets NVIDIA-A30" in response.json()["errors"]["profile"][0]


def test_desired_states_show_drift_with_bounded_queries(
    admin_api, operator_api, viewer_api, django_assert_max_num_queries
):
    pool, node = _pool_with_node()
    for _ in range(5):
        extra = NodeFactory(cluster=pool.cluster, pool=pool)
        GpuFactory(node=extra, index=0, product=H100)
    pk = admin_api.post("/api/v1/profiles/", MIG_PROFILE, format="json").json()["id"]
    operator_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json")
    with django_assert_max_num_queries(10):
        response = viewer_api.get("/api/v1/desired-states/", {"pool": pool.pk})
    rows = {r["node"]["name"]: r for r in response.json()["results"]}
    assert rows[node.name]["in_sync"] is False
    assert rows[node.name]["source"] == "pool" and rows[node.name]["desired_profile"]["id"] == pk


# --- the cluster's MIG strategy (ClusterPolicy spec.mig.strategy, contracts §1.2) -----------------------------------

MPS_PROFILE = {"name": "mps-4", "mode": "mps", "target_products": [H100], "replicas": 4}
UNEQUAL_PROFILE = {
    "name": "balanced",
    "mode": "mig",
    "target_products": [H100],
    "mig_layouts": {"all": "3g.40gb x1 + 2g.20gb x1 + 1g.10gb x2"},
}
SINGLE_OK_PROFILE = {"name": "ones", "mode": "mig", "target_products": [H100], "mig_layouts": {"all": "1g.10gb x7"}}


def _strategy_pool(strategy):
    pool, node = _pool_with_node()
    pool.cluster.mig_strategy = strategy
    pool.cluster.save()
    return pool, node


@pytest.mark.parametrize(
    ("strategy", "profile", "rule"),
    [
        ("mixed", MPS_PROFILE, "the device plugin refuses MPS (it exits at start-up"),
        ("single", UNEQUAL_PROFILE, "all MIG devices of a node must be of one profile, not 1g.10gb, 2g.20gb, 3g.40gb"),
        ("none", SINGLE_OK_PROFILE, "the device plugin advertises MIG-enabled GPUs whole, never their MIG devices"),
    ],
)
def test_preview_assign_and_pin_refuse_what_the_clusters_mig_strategy_cannot_run(
    admin_api, operator_api, viewer_api, strategy, profile, rule
):
    pool, node = _strategy_pool(strategy)
    pk = admin_api.post("/api/v1/profiles/", profile, format="json").json()["id"]
    expected = (
        f"{profile['name']} cannot run there: cluster {pool.cluster.name}'s ClusterPolicy sets "
        f"spec.mig.strategy={strategy}, under which {rule}"
    )
    for response in (
        viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"pool": pool.pk}, format="json"),
        viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"nodes": [node.pk]}, format="json"),
        operator_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json"),
        operator_api.post(f"/api/v1/profiles/{pk}/pin/", {"nodes": [node.pk]}, format="json"),
    ):
        assert response.status_code == 400, response.json()
        assert response.json()["message"].startswith(expected), response.json()["message"]
        assert response.json()["errors"]["profile"][0].startswith(f"cluster {pool.cluster.name}'s ClusterPolicy")
    assert not PoolSharing.objects.exists() and not NodePin.objects.exists()


@pytest.mark.parametrize(
    ("strategy", "profile"), [("single", MPS_PROFILE), ("", MPS_PROFILE), ("single", SINGLE_OK_PROFILE)]
)
def test_what_the_clusters_strategy_can_run_is_assigned(admin_api, operator_api, viewer_api, strategy, profile):
    pool, node = _strategy_pool(strategy)
    pk = admin_api.post("/api/v1/profiles/", profile, format="json").json()["id"]
    preview = viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"pool": pool.pk}, format="json")
    assert preview.status_code == 200, preview.json()
    (item,) = preview.json()["nodes"]
    if profile is SINGLE_OK_PROFILE:  # the profile says mixed; the cluster runs single: its slices are nvidia.com/gpu
        assert item["allocatable_after"] == {"nvidia.com/gpu": 14}
    assert operator_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json").status_code == 200
    assert operator_api.post(f"/api/v1/profiles/{pk}/pin/", {"nodes": [node.pk]}, format="json").status_code == 200


def test_an_empty_pool_is_judged_by_its_clusters_strategy(admin_api, operator_api):
    pool = NodePoolFactory(cluster__mig_strategy="mixed")
    pk = admin_api.post("/api/v1/profiles/", MPS_PROFILE, format="json").json()["id"]
    response = operator_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json")
    assert response.status_code == 400 and "spec.mig.strategy=mixed, under which" in response.json()["message"]


def test_a_single_cluster_refuses_gpus_a_per_gpu_layout_leaves_without_mig(admin_api, operator_api):
    pool, node = _strategy_pool("single")
    profile = {**SINGLE_OK_PROFILE, "mig_layouts": {"0": "1g.10gb x7"}}  # GPU 1 has no entry: MIG off
    pk = admin_api.post("/api/v1/profiles/", profile, format="json").json()["id"]
    response = operator_api.post(f"/api/v1/profiles/{pk}/pin/", {"nodes": [node.pk]}, format="json")
    assert response.status_code == 400 and "MIG must be on for every GPU of a node" in response.json()["message"]


def test_a_profile_change_the_clusters_strategy_cannot_run_is_refused(admin_api, operator_api):
    pool, _ = _strategy_pool("single")
    pk = admin_api.post("/api/v1/profiles/", SINGLE_OK_PROFILE, format="json").json()["id"]
    assert operator_api.post(f"/api/v1/profiles/{pk}/assign/", {"pool": pool.pk}, format="json").status_code == 200
    response = admin_api.patch(
        f"/api/v1/profiles/{pk}/", {"mig_layouts": UNEQUAL_PROFILE["mig_layouts"]}, format="json"
    )
    assert response.status_code == 400 and "spec.mig.strategy=single" in response.json()["message"]


# --- GPUs outside the MIG catalog --------------------------------------------------------------------------------

UNKNOWN = "NVIDIA-Tesla-V100-SXM2-32GB"


def test_a_gpu_outside_the_mig_catalog_is_shared_whole_but_never_split(admin_api, operator_api, viewer_api):
    node = NodeFactory(allocatable={"nvidia.com/gpu": 2})
    for index in range(2):
        GpuFactory(node=node, index=index, product=UNKNOWN)
    shared = {"name": "ts-4", "mode": "time_slicing", "target_products": [UNKNOWN], "replicas": 4}
    created = admin_api.post("/api/v1/profiles/", shared, format="json")
    assert created.status_code == 201, created.json()
    pk = created.json()["id"]
    preview = viewer_api.post(f"/api/v1/profiles/{pk}/preview/", {"nodes": [node.pk]}, format="json")
    (item,) = preview.json()["nodes"]
    assert item["errors"] == [] and item["allocatable_after"] == {"nvidia.com/gpu": 8} and not item["mig_config"]
    assert operator_api.post(f"/api/v1/profiles/{pk}/pin/", {"nodes": [node.pk]}, format="json").status_code == 200
    mig = {"name": "split", "mode": "mig", "target_products": [UNKNOWN], "mig_layouts": {"all": "1g.5gb x7"}}
    refused = admin_api.post("/api/v1/profiles/", mig, format="json")
    assert refused.status_code == 400
    assert refused.json()["errors"]["target_products"] == [
        f"{UNKNOWN} is not in Tessera's MIG catalog: MIG needs a known GPU model."
    ]
