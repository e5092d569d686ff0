"""The REST API answers like the UI: assign can start a rollout with a strategy (no race with the reconcile loop),
POST /rollouts/ returns the one rollout (201 + Location), strategy defaults are one, mig/validate takes the UI's
layout text, and `?search=` and `?q=` search the same lists."""

import pytest

from core.audit import Actor
from fleet import services as fleet_services
from fleet.models import Node
from sharing import services as sharing_services
from sharing.forms import AssignForm
from sharing.strategy import STRATEGY_NAMES
from tests.factories import ClusterFactory, NodePoolFactory
from tests.worker.test_engine import H100, _observation
from worker.choices import RolloutTrigger
from worker.models import Rollout
from worker.reconcile import reconcile

pytestmark = pytest.mark.django_db


@pytest.fixture
def actor(admin_user):
    return Actor.for_user(admin_user)


@pytest.fixture
def pool():
    cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster, name="gpu-a")
    fleet_services.inventory_record(
        cluster=cluster, nodes=[_observation(f"n{i}", mig_config="all-disabled", dp="whole") for i in range(4)]
    )
    Node.objects.update(pool=pool)
    return pool


@pytest.fixture
def mig7(actor):
    return sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )


def test_assign_with_a_strategy_starts_that_rollout_and_the_loop_does_not_race(operator_api, pool, mig7):
    body = {"pool": pool.pk, "rollout": {"batch_size": 2, "canary_count": 0, "busy_policy": "drain"}}
    response = operator_api.post(f"/api/v1/profiles/{mig7.pk}/assign/", body, format="json")
    assert response.status_code == 201, response.json()
    rollout = response.json()
    assert response["Location"] == rollout["url"]
    assert (rollout["batch_size"], rollout["canary_count"], rollout["busy_policy"]) == (2, 0, "drain")
    assert rollout["progress"]["total"] == 4 and rollout["trigger"] == RolloutTrigger.USER
    # The reconcile pass the assignment triggers finds every node changing already: no rollout of its own.
    assert reconcile() == []
    assert list(Rollout.objects.values_list("trigger", flat=True)) == [RolloutTrigger.USER]
    assert pool.sharing.profile == mig7


def test_assign_without_a_strategy_answers_the_profile_and_leaves_the_rollout_to_the_loop(operator_api, pool, mig7):
    response = operator_api.post(f"/api/v1/profiles/{mig7.pk}/assign/", {"pool": pool.pk}, format="json")
    assert response.status_code == 200 and response.json()["name"] == "mig-7"
    assert not Rollout.objects.exists()
    (rollout_id,) = reconcile()
    assert Rollout.objects.get(pk=rollout_id).trigger == RolloutTrigger.RECONCILE


def test_assign_with_nothing_to_roll_out_assigns_nothing(operator_api, pool, mig7, actor):
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=whole)
    Node.objects.update(observed_device_plugin_config="")  # nothing observed that differs: make the plan empty
    Node.objects.update(ready=False)  # not-ready nodes are left out of a rollout
    response = operator_api.post(f"/api/v1/profiles/{mig7.pk}/assign/", {"pool": pool.pk, "rollout": {}}, format="json")
    assert response.status_code == 400 and "Nothing to roll out" in response.json()["message"]
    pool.sharing.refresh_from_db()
    assert pool.sharing.profile == whole  # the UI's rule: assign and roll out succeed or fail together


def test_viewer_cannot_assign(viewer_api, pool, mig7):
    response = viewer_api.post(f"/api/v1/profiles/{mig7.pk}/assign/", {"pool": pool.pk}, format="json")
    assert response.status_code == 403


def test_post_rollouts_returns_one_rollout_even_for_several_profiles(operator_api, pool, mig7, actor):
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=mig7)
    pinned = Node.objects.order_by("name").first()
    sharing_services.node_pin_profile(actor=actor, node=pinned, profile=whole)
    response = operator_api.post("/api/v1/rollouts/", {"pool": pool.pk}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert isinstance(body, dict) and response["Location"] == body["url"]
    rollout = Rollout.objects.get()
    assert (body["id"], body["progress"]["total"], body["profile"]) == (rollout.pk, 4, None)
    assert set(rollout.changes.values_list("profile__name", flat=True)) == {"mig-7", "whole"}
    assert rollout.title == "gpu-a → their desired profiles (4 nodes)"


def test_strategy_defaults_are_the_same_in_api_and_ui(operator_api, pool, mig7, actor, settings):
    settings.TESSERA = {
        **settings.TESSERA,
        "ROLLOUT_DEFAULTS": {**settings.TESSERA["ROLLOUT_DEFAULTS"], "max_failures": 3, "batch_size": 7},
    }
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=mig7)
    created = operator_api.post("/api/v1/rollouts/", {"pool": pool.pk}, format="json").json()
    form = AssignForm()
    ui = {name: form[name].initial for name in STRATEGY_NAMES}
    api = {name: created[name] for name in STRATEGY_NAMES}
    assert api == ui == settings.TESSERA["ROLLOUT_DEFAULTS"]
    assert (api["max_failures"], api["batch_size"]) == (3, 7)
    # The form left empty uses the same defaults.
    empty = AssignForm({"pool": pool.pk, "rollout_now": "on"})
    assert empty.is_valid() and empty.strategy() == settings.TESSERA["ROLLOUT_DEFAULTS"]


def test_strategy_bounds_are_the_same_in_api_and_ui(operator_api, pool):
    bad = {"pool": pool.pk, "batch_size": 0, "wait_minutes": 24 * 60 + 1}
    api = operator_api.post("/api/v1/rollouts/", bad, format="json").json()["errors"]
    form = AssignForm({**bad, "rollout_now": "on"})
    assert not form.is_valid()
    assert set(api) == set(form.errors) - {"pool"} == {"batch_size", "wait_minutes"}


def test_mig_validate_takes_the_ui_layout_text_and_the_object_form(viewer_api):
    url, product = "/api/v1/mig/validate/", "NVIDIA-A100-SXM4-80GB"
    text = viewer_api.post(url, {"product": product, "layout": "3g.40gb + 2g.20gb + 1g.10gb x2"}, format="json")
    assert text.status_code == 200, text.json()
    layout = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
    obj = viewer_api.post(url, {"product": product, "layout": layout}, format="json")
    devices = viewer_api.post(url, {"product": product, "devices": layout}, format="json")
    assert text.json() == obj.json() == devices.json() and text.json()["valid"] is True
    # The issue's own text parses; that layout does not fit on one GPU, and the answer says why.
    issue = viewer_api.post(url, {"product": product, "layout": "3g.40gb x2 + 1g.10gb"}, format="json")
    assert issue.status_code == 200 and issue.json()["valid"] is False and issue.json()["errors"]
    too_much = viewer_api.post(url, {"product": product, "layout": "7g.80gb + 1g.10gb"}, format="json").json()
    assert too_much["valid"] is False and too_much["errors"]
    garbled = viewer_api.post(url, {"product": product, "layout": "3g.40gb times two"}, format="json")
    assert garbled.status_code == 400 and list(garbled.json()["errors"]) == ["layout"]
    neither = viewer_api.post(url, {"product": product}, format="json")
    assert neither.status_code == 400 and list(neither.json()["errors"]) == ["layout"]


@pytest.mark.parametrize(
    "path,match,other",
    [
        ("/api/v1/nodes/", "n1", "n2"),
        ("/api/v1/node-pools/", "gpu-a", "gpu-b"),
        ("/api/v1/profiles/", "mig-7", "whole"),
        ("/api/v1/gpus/", "n1", "n2"),
    ],
)
def test_search_and_q_search_the_same_rows(viewer_api, pool, mig7, actor, path, match, other):
    NodePoolFactory(cluster=pool.cluster, name="gpu-b")
    sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])

    def names(param):
        rows = viewer_api.get(path, {param: match}).json()["results"]
        return sorted(str(r.get("name") or r["node"]["name"]) for r in rows)

    found = names("search")
    assert found and found == names("q") and other not in found


def test_schema_lists_search_and_q(viewer_api):
    paths = viewer_api.get("/api/schema/?format=json").json()["paths"]
    for path in ("/api/v1/nodes/", "/api/v1/profiles/", "/api/v1/rollouts/"):
        assert {"search", "q"} <= {p["name"] for p in paths[path]["get"]["parameters"]}, path
