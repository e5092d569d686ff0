"""Importing a cluster's hand-written mig-parted and device-plugin ConfigMaps, against the simulator with the real
`kubernetes` client: the preview judges each config as mig-parted and the device plugin do (and the simulated
components fail where Tessera says they would), the confirmation creates profiles, and nodes already running those
configs are not re-rolled once the imported profile is their pool's default."""

import pytest
from django.urls import reverse
from kubernetes import client

from core.audit import Actor
from core.models import AuditEvent
from fleet.models import Node, NodePool
from sharing import nvidia_configs as nc
from sharing import services as sharing_services
from sharing.models import SharingProfile
from sharing.render import MigDeviceSpec, render_mig_parted_config
from tests.factories import ClusterFactory
from tests.sharing.test_yaml_bounds import BOMB
from worker import reconcile, services
from worker.choices import IN_FLIGHT_STATUSES
from worker.drivers import driver_for
from worker.drivers.base import DriverError
from worker.inventory.cluster import sync_cluster_full
from worker.models import Rollout
from worker.selectors import plan, reconcilable_nodes

pytestmark = pytest.mark.django_db
NS, MERGE = "gpu-operator", "application/merge-patch+json"
TEAM, TEAM_2, TS_NODE, EMPTY_NODE, T4 = (
    "gpu-node-0002",
    "gpu-node-0005",
    "gpu-node-0007",
    "gpu-node-0004",
    "gpu-node-0003",
)
NEW_H100 = "gpu-node-0010"  # an H100 running the operator's all-balanced
MIG_CM, PLUGIN_CM = "team-mig-parted", "team-device-plugin"
TEAM_CONFIGS = """  team-7x1g:
  - {devices: all, mig-enabled: true, mig-devices: {1g.10gb: 7}}
  team-empty:
  - {devices: [], mig-enabled: true, mig-devices: {7g.80gb: 1}}
  - {devices: all, mig-enabled: false}
"""
PLUGIN_CONFIGS = {
    "mixed": "version: v1\nflags:\n  migStrategy: mixed\n",
    "ts-4": "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    "ts-broken": "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n",
}


def label(core, node, **labels):
    keys = {"mig": "nvidia.com/mig.config", "plugin": "nvidia.com/device-plugin.config"}
    core.patch_node(node, {"metadata": {"labels": {keys[k]: v for k, v in labels.items()}}}, _content_type=MERGE)


def set_mig_file(core, text):
    core.patch_namespaced_config_map(MIG_CM, NS, {"data": {"config.yaml": text}}, _content_type=MERGE)


@pytest.fixture
def team(sim, core, sim_cluster):
    """The cluster as a team leaves it: its own mig-parted file (the operator's default plus two configs of its
    own), its own device-plugin ConfigMap, the ClusterPolicy pointing at both, nodes labelled; then synced."""
    default = core.read_namespaced_config_map("default-mig-parted-config", NS).data["config.yaml"]
    core.create_namespaced_config_map(
        NS, {"metadata": {"name": MIG_CM}, "data": {"config.yaml": default + TEAM_CONFIGS}}
    )
    core.create_namespaced_config_map(NS, {"metadata": {"name": PLUGIN_CM}, "data": PLUGIN_CONFIGS})
    custom = client.CustomObjectsApi(core.api_client)
    policy = {
        "spec": {
            "migManager": {"config": {"name": MIG_CM}},
            "devicePlugin": {"config": {"name": PLUGIN_CM, "default": "mixed"}},
        }
    }
    custom.patch_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", "cluster-policy", policy, _content_type=MERGE
    )
    label(core, TEAM, mig="team-7x1g", plugin=None)
    label(core, TEAM_2, mig="team-7x1g", plugin=None)
    label(core, TS_NODE, mig="all-disabled", plugin="ts-4")
    label(core, EMPTY_NODE, mig="team-empty")
    label(core, T4, plugin="ts-broken")
    assert sim.settle()
    sync_cluster_full(sim_cluster)
    return sim_cluster


def url(cluster):
    return f"/api/v1/clusters/{cluster.pk}/nvidia-import/"


def test_the_simulated_components_run_what_their_real_parsers_accept(sim, team):
    # devices: [] is accepted by mig-parted (it matches no GPU); the other entry turns MIG off everywhere.
    assert sim.node(EMPTY_NODE)["metadata"]["labels"]["nvidia.com/mig.config.state"] == "success"
    assert sim.node(TEAM)["metadata"]["labels"]["nvidia.com/mig-1g.10gb.count"] == "56"
    # A timeSlicing block without resources: the plugin refuses the config, the node advertises no GPU.
    assert "no resources specified" in sim.state(T4)["device_plugin"]["error"]


def test_preview_judges_every_config_as_its_component_does(admin_api, team):
    response = admin_api.get(url(team))
    assert response.status_code == 200, response.content
    body = response.json()
    configs = {(c["kind"], c["name"]): c for c in body["configs"]}
    broken = configs["device-plugin", "ts-broken"]
    assert (broken["accepted"], broken["refusal"], broken["rule"]) == (
        False,
        "no resources specified",
        nc.RULE_REPLICATED,
    )
    assert broken["nodes"] == [T4]
    assert configs["mig-parted", "team-7x1g"]["accepted"] and configs["mig-parted", "team-7x1g"]["nodes"] == [
        TEAM,
        TEAM_2,
    ]
    assert "devices: []" in configs["mig-parted", "team-empty"]["notes"][0]
    assert configs["device-plugin", "mixed"]["accepted"] and TEAM in configs["device-plugin", "mixed"]["nodes"]
    profiles = {p["name"]: p for p in body["profiles"]}
    team_profile = profiles["team-7x1g"]
    assert (team_profile["accepted"], team_profile["nodes"], team_profile["device_plugin_config"]) == (
        True,
        [TEAM, TEAM_2],
        "",
    )
    assert team_profile["profile"]["mig_layouts"] == {"all": {"1g.10gb": 7}}
    assert profiles["all-disabled + ts-4"]["profile"]["mode"] == "time_slicing"
    assert profiles["ts-broken"]["refusal"] == "no resources specified"
    assert "team-7x1g" in body["creatable"] and not SharingProfile.objects.exists()  # a preview creates nothing


def test_import_then_assign_rolls_nothing_out_to_nodes_already_running_it(admin_api, team):
    response = admin_api.post(url(team), {"names": ["team-7x1g", "all-disabled + ts-4"]}, format="json")
    assert response.status_code == 201, response.content
    assert sorted(p["name"] for p in response.json()) == ["all-disabled + ts-4", "team-7x1g"]
    imported = SharingProfile.objects.get(name="team-7x1g")
    assert imported.imported["mig_config"] == "team-7x1g" and imported.imported["device_plugin_config"] == ""
    assert AuditEvent.objects.filter(action="profile.import", object_id=str(imported.pk)).exists()
    actor = Actor.system("test")
    for pool_name, nodes, profile in (
        ("team", [TEAM, TEAM_2], imported),
        ("ts", [TS_NODE], SharingProfile.objects.get(name="all-disabled + ts-4")),
    ):
        pool = NodePool.objects.create(cluster=team, name=pool_name)
        Node.objects.filter(name__in=nodes).update(pool=pool)
        sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    pools = NodePool.objects.filter(name__in=["team", "ts"])
    assert plan(reconcilable_nodes(Node.objects.filter(pool__in=pools))) == {}
    assert reconcile.reconcile() == []
    # The same layout written by hand in Tessera renders to its own names: those nodes would be re-rolled.
    own = sharing_services.profile_create(
        actor=actor,
        name="own-7x1g",
        mode="mig",
        target_products=["NVIDIA-H100-80GB-HBM3"],
        mig_layouts={"all": {"1g.10gb": 7}},
    )
    sharing_services.pool_set_profile(actor=actor, pool=pools.get(name="team"), profile=own)
    assert (
        sum(len(changes) for changes in plan(reconcilable_nodes(Node.objects.filter(pool__name="team"))).values()) == 2
    )


def test_an_unquoted_hex_device_filter_is_refused_by_tessera_and_by_mig_manager(sim, core, admin_api, team):
    default = core.read_namespaced_config_map("default-mig-parted-config", NS).data["config.yaml"]
    set_mig_file(
        core,
        default + TEAM_CONFIGS + "  team-hex:\n  - {devices: all, device-filter: 0x233010DE, mig-enabled: false}\n",
    )
    configs = {(c["kind"], c["name"]): c for c in admin_api.get(url(team)).json()["configs"]}
    refusal = configs["mig-parted", "team-7x1g"]["refusal"]
    assert refusal.startswith("mig-configs.team-hex[0]: (json: cannot unmarshal number")
    label(core, TEAM_2, mig="all-disabled")
    assert sim.settle()
    assert sim.node(TEAM_2)["metadata"]["labels"]["nvidia.com/mig.config.state"] == "failed"


def test_only_admins_confirm_and_the_agent_driver_has_nothing_to_import(viewer_api, operator_api, admin_api, team):
    assert viewer_api.get(url(team)).status_code == 200
    assert operator_api.post(url(team), {}, format="json").status_code == 403
    agent = ClusterFactory(name="agents", driver="agent")
    response = admin_api.get(url(agent))
    assert response.status_code == 400 and "only a GPU Operator's ConfigMaps" in response.json()["message"]


def test_refused_or_existing_names_are_refused_on_confirm(admin_api, team):
    response = admin_api.post(url(team), {"names": ["ts-broken"]}, format="json")
    assert response.status_code == 400 and "no resources specified" in str(response.json())
    assert admin_api.post(url(team), {"names": ["team-7x1g"]}, format="json").status_code == 201
    assert admin_api.post(url(team), {"names": ["team-7x1g"]}, format="json").status_code == 400


def test_the_page_previews_and_an_admin_confirms(client, admin_user, viewer, team):
    client.force_login(viewer)
    page = client.get(reverse("console:cluster_import", args=[team.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "no resources specified" in text and "team-7x1g" in text and "Importing needs the admin role" in text
    assert (
        client.post(reverse("console:cluster_import_confirm", args=[team.pk]), {"names": ["team-7x1g"]}).status_code
        == 403
    )
    client.force_login(admin_user)
    assert (
        'name="names" value="team-7x1g"'
        in client.get(reverse("console:cluster_import", args=[team.pk])).content.decode()
    )
    response = client.post(reverse("console:cluster_import_confirm", args=[team.pk]), {"names": ["team-7x1g"]})
    assert response.status_code == 302 and SharingProfile.objects.filter(name="team-7x1g").exists()
    detail = client.get(SharingProfile.objects.get(name="team-7x1g").get_absolute_url()).content.decode()
    assert "mig-parted config <code>team-7x1g</code>" in detail


def test_an_imported_profile_rolls_out_under_its_own_names_once_the_configmaps_are_adopted(sim, core, admin_api, team):
    """A node that did not run the pair gets the very names the others carry (the "" plugin key: no label)."""
    assert admin_api.post(url(team), {"names": ["team-7x1g"]}, format="json").status_code == 201
    driver_for(team).adopt_operator_configs()  # Tessera writes only to ConfigMaps it manages
    assert sim.settle()
    sync_cluster_full(team)
    pool = NodePool.objects.create(cluster=team, name="team")
    Node.objects.filter(name__in=[TEAM, TEAM_2, NEW_H100]).update(pool=pool)
    sharing_services.pool_set_profile(
        actor=Actor.system("test"), pool=pool, profile=SharingProfile.objects.get(name="team-7x1g")
    )
    (rollout_id,) = reconcile.reconcile()
    rollout = Rollout.objects.get(pk=rollout_id)
    assert list(rollout.changes.values_list("node__name", flat=True)) == [NEW_H100]
    for _ in range(30):
        started = services.rollout_advance(rollout.pk)
        active = list(rollout.changes.filter(status__in=IN_FLIGHT_STATUSES).values_list("pk", flat=True))
        services.node_changes_step(sorted(set(started + active)))
        sim.settle()
        rollout.refresh_from_db()
        if rollout.status != "running":
            break
    assert rollout.status == "succeeded", list(rollout.changes.values_list("status", "error"))
    labels = sim.node(NEW_H100)["metadata"]["labels"]
    assert labels["nvidia.com/mig.config"] == "team-7x1g" and "nvidia.com/device-plugin.config" not in labels
    assert labels["nvidia.com/mig-1g.10gb.count"] == str(7 * len(sim.nodes[NEW_H100].gpus))


def test_a_hostile_mig_parted_file_is_a_refusal_to_a_viewer_and_to_the_worker(sim, core, viewer_api, team):
    """Issue 25, point 3: the 335-byte alias bomb in the ConfigMap costs a viewer's preview one bounded parse and
    reads as mig-parted's refusals do; the worker adding a config during a rollout refuses the file the same way."""
    driver = driver_for(team)
    driver.adopt_operator_configs()  # Tessera's own ConfigMaps, which rollouts write to
    policy = driver.operator.policy()
    for name in (MIG_CM, policy.mig_configmap):
        core.patch_namespaced_config_map(name, NS, {"data": {"config.yaml": BOMB}}, _content_type=MERGE)
    team.refresh_from_db()
    response = viewer_api.get(url(team))
    assert response.status_code == 200, response.content
    body = response.json()
    mig = [c for c in body["configs"] if c["kind"] == "mig-parted"]
    assert mig and all("aliases expanded" in c["refusal"] and c["rule"] == nc.RULE_BOUNDS for c in mig)
    assert any("aliases expanded" in problem for problem in body["problems"])
    wanted = render_mig_parted_config({"tessera-one": [MigDeviceSpec("all", False)]})
    with pytest.raises(DriverError, match="cannot be read: the file holds more than 20,000 values"):
        driver.operator.ensure(mig_configs={"tessera-one": wanted}, plugin_configs={})
