"""sharing.nvidia_import: a cluster's own configs become profiles per pair of config names its nodes run, refused with
the components' reasons where they refuse, and rendered back to the same names (so nothing re-rolls)."""

from sharing import nvidia_configs as nc
from sharing.nvidia_import import DEVICE_PLUGIN, MIG_PARTED, RULE_TESSERA, ClusterConfigs, NodeLabels, plan_import
from sharing.spec import node_config

H100, A100, T4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "Tesla-T4"
MIG_FILE = """version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  team-7x1g:
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  balanced:
    - device-filter: ["0x233010DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
  nowhere:
    - devices: []
      mig-enabled: true
      mig-devices: {"7g.80gb": 1}
    - devices: all
      mig-enabled: false
  too-big:
    - devices: all
      mig-enabled: true
      mig-devices: {"7g.80gb": 2}
"""
PLUGIN = {
    "mixed": "version: v1\nflags: {migStrategy: mixed}\n",
    "ts-4": "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
    "mps-2": "version: v1\nsharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
    "broken": "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n",
    "two-counts": (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n"
        "      - {name: nvidia.com/mig-2g.20gb, replicas: 3}\n      - {name: nvidia.com/mig-3g.40gb, replicas: 3}\n"
    ),
    "ts-1g": "version: v1\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]\n",
}


def gpus(product, count=8):
    return tuple((index, product) for index in range(count))


NODES = (
    NodeLabels("h100-a", "team-7x1g", "", gpus(H100)),
    NodeLabels("h100-b", "team-7x1g", "", gpus(H100)),
    NodeLabels("h100-c", "all-disabled", "ts-4", gpus(H100)),
    NodeLabels("h100-d", "all-disabled", "broken", gpus(H100)),
    NodeLabels("h100-e", "gone", "", gpus(H100)),
    NodeLabels("h100-f", "tessera-mig-0123456789", "tessera-dp-0123456789", gpus(H100)),
    NodeLabels("t4-a", "", "mps-2", gpus(T4, 4)),
)


def cluster(**overrides) -> ClusterConfigs:
    values = {
        "cluster": "prod",
        "policy": "cluster-policy",
        "mig_strategy": "mixed",
        "mig_configmap": "custom-mig-parted-config",
        "mig_parted_text": MIG_FILE,
        "plugin_configmap": "custom-device-plugin-config",
        "plugin_default": "mixed",
        "plugin_configs": PLUGIN,
        "nodes": NODES,
        "products": (H100, A100, T4),
    }
    return ClusterConfigs(**{**values, **overrides})


def by_name(items):
    return {item.name: item for item in items}


def test_every_config_name_gets_the_verdict_of_its_component():
    verdicts = {(v.kind, v.name): v for v in plan_import(cluster()).configs}
    assert verdicts[DEVICE_PLUGIN, "broken"].refusal == "no resources specified"
    assert verdicts[DEVICE_PLUGIN, "broken"].rule == nc.RULE_REPLICATED
    assert verdicts[DEVICE_PLUGIN, "broken"].nodes == ("h100-d",)
    assert verdicts[MIG_PARTED, "gone"].refusal == "selected mig-config not present: gone"
    assert verdicts[MIG_PARTED, "gone"].rule == nc.RULE_SELECTED
    # The operator sets MIG_STRATEGY=mixed from the ClusterPolicy: the plugin exits with MPS (contracts §3.3).
    assert verdicts[DEVICE_PLUGIN, "mps-2"].refusal == "using --mig-strategy=mixed is not supported with MPS"
    assert verdicts[MIG_PARTED, "nowhere"].accepted and "devices: []" in verdicts[MIG_PARTED, "nowhere"].notes[0]
    assert verdicts[DEVICE_PLUGIN, "mixed"].nodes == ("h100-a", "h100-b", "h100-e")  # no label: the default key
    assert verdicts[MIG_PARTED, "team-7x1g"].profiles == ("team-7x1g",)
    assert not any(name.startswith("tessera-") for _, name in verdicts)


def test_a_pair_its_nodes_run_becomes_a_profile_that_renders_to_the_same_names():
    profile = by_name(plan_import(cluster()).profiles)["team-7x1g"]
    assert profile.nodes == ("h100-a", "h100-b") and profile.products == (H100,)
    assert profile.spec.mode == "mig" and profile.spec.mig_strategy == "mixed"
    assert dict(profile.spec.mig_layouts) == {"all": {"1g.10gb": 7}}
    config = node_config(profile.spec, gpus(H100))
    assert (config.mig_config_name, config.device_plugin_key) == ("team-7x1g", "")  # what the nodes carry
    assert "team-7x1g:" in config.mig_parted_text and config.device_plugin_text == PLUGIN["mixed"]


def test_sharing_comes_from_the_plugin_config_of_the_pair():
    profile = by_name(plan_import(cluster()).profiles)["all-disabled + ts-4"]
    assert (profile.spec.mode, profile.spec.replicas, profile.spec.fail_requests_greater_than_one) == (
        "time_slicing",
        4,
        False,
    )
    assert node_config(profile.spec, gpus(H100)).mig_config_name == "all-disabled"


def test_mps_is_failing_large_requests_unless_the_config_says_otherwise():
    profile = by_name(plan_import(cluster(mig_strategy="single")).profiles)["mps-2"]
    assert profile.nodes == ("t4-a",) and profile.spec.mode == "mps"
    assert profile.spec.fail_requests_greater_than_one is True  # absent under mps: true (contracts §3.3)
    config = node_config(profile.spec, gpus(T4, 4))
    assert (config.mig_config_name, config.device_plugin_key) == (None, "mps-2")


def test_refused_configs_refuse_the_profiles_of_their_pairs():
    profiles = by_name(plan_import(cluster()).profiles)
    assert profiles["all-disabled + broken"].refusal == "no resources specified"
    assert profiles["gone"].refusal == "selected mig-config not present: gone"
    assert "7g.80gb" in profiles["too-big"].refusal and profiles["too-big"].rule == RULE_TESSERA


def test_a_config_with_layouts_per_product_makes_a_profile_per_product():
    profiles = by_name(plan_import(cluster(nodes=(), products=(H100, A100))).profiles)
    assert dict(profiles[f"balanced ({H100})"].spec.mig_layouts) == {"all": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
    assert dict(profiles[f"balanced ({A100})"].spec.mig_layouts) == {"all": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}}
    # Unused configs come alone; a plugin key alone keeps its key and lets Tessera render MIG.
    assert profiles["ts-4"].spec.kept.mig_config is None


def test_time_slicing_on_mig_must_share_every_mig_device_alike():
    nodes = (
        NodeLabels("h100-a", "team-7x1g", "ts-1g", gpus(H100)),
        NodeLabels("h100-b", "balanced", "two-counts", gpus(H100)),
        NodeLabels("h100-c", "balanced", "ts-1g", gpus(H100)),
    )
    profiles = by_name(plan_import(cluster(nodes=nodes)).profiles)
    assert (profiles["team-7x1g + ts-1g"].spec.mode, profiles["team-7x1g + ts-1g"].spec.replicas) == ("mig", 2)
    assert "one replica count" in profiles["balanced + two-counts"].refusal
    assert "nvidia.com/mig-2g.20gb, nvidia.com/mig-3g.40gb" in profiles["balanced + ts-1g"].refusal


def test_an_unreadable_mig_parted_file_refuses_every_mig_config_with_its_reason():
    text = MIG_FILE.replace('device-filter: "0x20B010DE"', "device-filter: 0x20B010DE")
    plan = plan_import(cluster(mig_parted_text=text))
    refused = {v.name: v for v in plan.configs if v.kind == MIG_PARTED}
    assert refused["team-7x1g"].refusal.startswith("mig-configs.balanced[1]: (json: cannot unmarshal number")
    assert refused["team-7x1g"].rule == nc.RULE_ENTRY and plan.problems
    assert not by_name(plan.profiles)["team-7x1g"].accepted


def test_a_cluster_without_a_mig_parted_configmap_says_so():
    plan = plan_import(cluster(mig_configmap="", mig_parted_text=None))
    assert "generates its configs per node" in plan.problems[0]
    assert by_name(plan.profiles)["team-7x1g"].refusal == "no mig-parted ConfigMap to read"
