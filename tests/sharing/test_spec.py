"""NVIDIA's rules for profiles, rendering per node, allocatable and resets (pure)."""

import pytest

from sharing.mig import PRODUCTS, GpuProduct
from sharing.render import parse_device_plugin_config, parse_mig_parted_config
from sharing.spec import (
    ProfileSpec,
    allocatable,
    cluster_strategy_problems,
    mig_mode_changes,
    mps_honours_fail_false,
    node_config,
    node_validation_errors,
    single_strategy_problem,
    strategy_problems,
    under_cluster_strategy,
    validate_spec,
)

H100 = "NVIDIA-H100-80GB-HBM3"
EIGHT_H100 = [(i, H100) for i in range(8)]


def test_valid_profiles_of_every_mode():
    assert validate_spec(ProfileSpec("passthrough", (H100,))) == {}
    assert validate_spec(ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}})) == {}
    assert validate_spec(ProfileSpec("mps", (H100,), replicas=4, mps_active_thread_percentage=25)) == {}
    assert validate_spec(ProfileSpec("time_slicing", (H100,), replicas=4, time_slice_interval="long")) == {}
    assert validate_spec(ProfileSpec("mig", (H100,), {"all": {"3g.40gb": 2}, "7": None})) == {}


@pytest.mark.parametrize(
    ("spec", "field", "text"),
    [
        (ProfileSpec("time_slicing", (H100,), replicas=1), "replicas", "at least 2"),
        (ProfileSpec("mps", (H100,), replicas=49), "replicas", "at most 48"),
        (ProfileSpec("mig", ("NVIDIA-V100",), {"all": {"1g.10gb": 7}}), "target_products", "not in Tessera's MIG"),
        (ProfileSpec("mps", (H100,), {"all": {"1g.10gb": 7}}, replicas=4), "mig_layouts", "only to MIG"),
        (
            ProfileSpec("time_slicing", (H100,), replicas=4, mps_active_thread_percentage=50),
            "mps_active_thread_percentage",
            "only to MPS",
        ),
        (ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 8}}), "mig_layouts.all", "needs 8"),
        (ProfileSpec("mig", ("NVIDIA-L4",), {"all": {"1g.10gb": 1}}), "target_products", "does not support MIG"),
        (
            ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}, "0": {"3g.40gb": 2}}, mig_strategy="single"),
            "mig_strategy",
            "mixed",
        ),
        (ProfileSpec("mig", (H100,), {}), "mig_layouts", "needs a layout"),
        (ProfileSpec("passthrough", ()), "target_products", "at least one"),
        (
            ProfileSpec("mps", (H100,), replicas=4, mps_pinned_memory_limit_mib=90000),
            "mps_pinned_memory_limit_mib",
            "more than a GPU",
        ),
    ],
)
def test_invalid_profiles_say_why_per_field(spec, field, text):
    errors = validate_spec(spec)
    assert field in errors, errors
    assert any(text in message for message in errors[field]), errors[field]


def test_mps_cap_is_16_below_compute_capability_7_5(monkeypatch):
    volta = GpuProduct(
        "Tesla-V100-SXM2-16GB", "Tesla V100-SXM2-16GB", 16384, "volta", (7, 0), ("0x1DB110DE",), 80, False
    )
    monkeypatch.setitem(PRODUCTS, volta.name, volta)
    assert validate_spec(ProfileSpec("mps", ("Tesla-T4",), replicas=20)) == {}  # T4 is 7.5: the cap is 48
    errors = validate_spec(ProfileSpec("mps", (volta.name, "Tesla-T4"), replicas=20))
    assert errors["replicas"] == [
        "MPS allows at most 16 replicas per GPU (Tesla-V100-SXM2-16GB is below compute capability 7.5)."
    ]


def test_node_config_uniform_mig_layout_renders_one_entry_and_stable_names():
    spec = ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}})
    config = node_config(spec, EIGHT_H100)
    assert config == node_config(spec, list(reversed(EIGHT_H100)))
    parsed = parse_mig_parted_config(config.mig_parted_text)
    (entries,) = parsed.values()
    assert [(e.devices, e.mig_enabled, dict(e.mig_devices)) for e in entries] == [("all", True, {"1g.10gb": 7})]
    assert parse_device_plugin_config(config.device_plugin_text).mig_strategy == "mixed"
    other = node_config(ProfileSpec("mig", (H100,), {"all": {"3g.40gb": 2}}), EIGHT_H100)
    assert other.mig_config_name != config.mig_config_name


def test_node_config_per_gpu_layouts_and_mixed_products():
    spec = ProfileSpec("mig", (H100, "NVIDIA-A100-SXM4-80GB"), {"all": {"1g.10gb": 7}, "1": None})
    config = node_config(spec, [(0, H100), (1, H100), (2, "NVIDIA-A100-SXM4-80GB")])
    entries = config.mig_entries
    assert [(e.devices, e.mig_enabled) for e in entries] == [((0,), True), ((1,), False), ((2,), True)]
    assert all(e.device_filter for e in entries)


def test_non_mig_node_gets_no_mig_config_and_time_slicing_plugin():
    spec = ProfileSpec("time_slicing", ("NVIDIA-L4",), replicas=4, rename_shared=True)
    config = node_config(spec, [(0, "NVIDIA-L4"), (1, "NVIDIA-L4")])
    assert config.mig_config_name is None
    plugin = parse_device_plugin_config(config.device_plugin_text)
    assert (plugin.sharing, plugin.replicas, plugin.rename_by_default) == ("time_slicing", 4, True)
    assert allocatable(spec, [(0, "NVIDIA-L4"), (1, "NVIDIA-L4")]) == {"nvidia.com/gpu.shared": 8}


def test_allocatable_per_mode():
    assert allocatable(ProfileSpec("passthrough", (H100,)), EIGHT_H100) == {"nvidia.com/gpu": 8}
    mig = ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}})
    assert allocatable(mig, EIGHT_H100) == {"nvidia.com/mig-1g.10gb": 56}
    balanced = ProfileSpec("mig", (H100,), {"all": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}, mig_strategy="mixed")
    assert allocatable(balanced, EIGHT_H100[:2]) == {
        "nvidia.com/mig-1g.10gb": 4,
        "nvidia.com/mig-2g.20gb": 2,
        "nvidia.com/mig-3g.40gb": 2,
    }
    single = ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}}, mig_strategy="single")
    assert allocatable(single, EIGHT_H100) == {"nvidia.com/gpu": 56}
    shared_mig = ProfileSpec("mig", (H100,), {"all": {"3g.40gb": 2}}, replicas=2)
    assert allocatable(shared_mig, EIGHT_H100[:1]) == {"nvidia.com/mig-3g.40gb": 4}


def test_mig_mode_changes_mean_resets():
    mig = ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}})
    assert mig_mode_changes(mig, [(0, H100, False), (1, H100, True)]) == [0]
    assert mig_mode_changes(ProfileSpec("passthrough", (H100,)), [(0, H100, True), (1, "NVIDIA-L4", False)]) == [0]


def test_node_validation_errors():
    spec = ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}, "9": None})
    problems = node_validation_errors(spec, [(0, "NVIDIA-A30")])
    assert any("targets NVIDIA-H100-80GB-HBM3" in p for p in problems)
    assert any("no GPU 9" in p for p in problems)


# --- GPUs outside the MIG catalog ---------------------------------------------------------------------------------

UNKNOWN = "NVIDIA-Tesla-V100-SXM2-32GB"  # a real GPU the MIG catalog does not list


@pytest.mark.parametrize(
    "spec",
    [
        ProfileSpec("passthrough", (UNKNOWN,)),
        ProfileSpec("time_slicing", (UNKNOWN,), replicas=4),
        ProfileSpec("mps", (UNKNOWN,), replicas=4, mps_pinned_memory_limit_mib=1024),
    ],
)
def test_unknown_gpus_get_every_mode_but_mig(spec):
    gpus = [(0, UNKNOWN), (1, UNKNOWN)]
    assert validate_spec(spec) == {}
    assert node_validation_errors(spec, gpus) == []
    config = node_config(spec, gpus)
    assert config.mig_config_name is None  # MIG Manager is left alone on a GPU Tessera cannot split
    replicas = 1 if spec.mode == "passthrough" else 4
    assert allocatable(spec, gpus) == {"nvidia.com/gpu": 2 * replicas}
    assert mig_mode_changes(spec, [(0, UNKNOWN, False)]) == []


def test_unknown_gpus_cannot_get_mig():
    spec = ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}})
    assert validate_spec(ProfileSpec("mig", (UNKNOWN,), {"all": {"1g.10gb": 7}}))["target_products"] == [
        f"{UNKNOWN} is not in Tessera's MIG catalog: MIG needs a known GPU model."
    ]
    problems = node_validation_errors(spec, [(0, UNKNOWN)])
    assert f"GPU 0: {UNKNOWN} is not in Tessera's MIG catalog: MIG needs a known GPU model" in problems


# --- MPS failRequestsGreaterThanOne (§3.3) -------------------------------------------------------------------------


@pytest.mark.parametrize("fail", [False, True])
def test_mps_renders_fail_requests_greater_than_one_explicitly(fail):
    spec = ProfileSpec("mps", (H100,), replicas=4, fail_requests_greater_than_one=fail)
    text = node_config(spec, EIGHT_H100).device_plugin_text
    assert f"    failRequestsGreaterThanOne: {'true' if fail else 'false'}\n" in text
    assert parse_device_plugin_config(text).fail_requests_greater_than_one is fail


def test_time_slicing_leaves_false_absent_as_every_plugin_reads_it():
    text = node_config(ProfileSpec("time_slicing", (H100,), replicas=4), EIGHT_H100).device_plugin_text
    assert "failRequestsGreaterThanOne" not in text


@pytest.mark.parametrize(
    ("version", "honours"),
    [("v0.20.0", True), ("v0.21.1", True), ("0.20.0-ubi9", True), ("v0.17.4", False), ("v0.19.0", False)]
    + [("", None), ("sha256:0f3a", None), ("latest", None)],
)
def test_which_plugin_versions_honour_mps_fail_false(version, honours):
    assert mps_honours_fail_false(version) is honours


# --- the cluster's MIG strategy (§1.2) -----------------------------------------------------------------------------


def test_mps_cannot_run_under_mixed():
    mps = ProfileSpec("mps", (H100,), replicas=4)
    assert cluster_strategy_problems(mps, "prod", "mixed") == [
        "cluster prod's ClusterPolicy sets spec.mig.strategy=mixed, under which the device plugin refuses MPS "
        "(it exits at start-up: the node advertises no GPU)"
    ]
    assert strategy_problems(mps, "single") == strategy_problems(mps, "none") == strategy_problems(mps, "") == []


@pytest.mark.parametrize(
    ("layouts", "problem"),
    [
        ({"all": {"1g.10gb": 7}}, None),
        ({"all": {"1g.10gb": 7}, "0": {"1g.10gb": 3}}, None),  # counts may differ, the plugin compares types
        (
            {"all": {"3g.40gb": 1, "1g.10gb": 4}},
            "all MIG devices of a node must be of one profile, not 1g.10gb, 3g.40gb",
        ),
        ({"all": {"1g.10gb": 7}, "0": {"3g.40gb": 2}}, "all MIG devices of a node must be of one profile"),
        ({"all": {"1g.10gb": 7}, "3": None}, "MIG must be on for every GPU of a node"),
        ({"all": {"1g.10gb": 0}}, "every MIG-enabled GPU needs at least one MIG device"),
    ],
)
def test_single_strategy_needs_slices_of_one_profile(layouts, problem):
    found = single_strategy_problem(list(layouts.values()))
    assert (found is None) if problem is None else problem in found
    spec = ProfileSpec("mig", (H100,), layouts)
    assert bool(strategy_problems(spec, "single")) is (problem is not None)
    assert strategy_problems(spec, "mixed") == []


def test_single_strategy_judges_a_nodes_gpus_without_an_entry_as_mig_off():
    spec = ProfileSpec("mig", (H100,), {"0": {"1g.10gb": 7}, "1": {"1g.10gb": 7}})
    assert strategy_problems(spec, "single", [0, 1]) == []
    (problem,) = strategy_problems(spec, "single", [0, 1, 2])
    assert "MIG must be on for every GPU" in problem


def test_mig_cannot_run_under_none():
    (problem,) = strategy_problems(ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}}), "none")
    assert "advertises MIG-enabled GPUs whole" in problem


def test_the_clusters_strategy_decides_rendering_and_allocatable():
    profile = ProfileSpec("mig", (H100,), {"all": {"1g.10gb": 7}}, mig_strategy="mixed", replicas=2)
    on_single = under_cluster_strategy(profile, "single")
    assert on_single.mig_strategy == "single"
    assert allocatable(on_single, EIGHT_H100[:2]) == {"nvidia.com/gpu": 28}
    plugin = parse_device_plugin_config(node_config(on_single, EIGHT_H100).device_plugin_text)
    assert (plugin.mig_strategy, plugin.resources) == ("single", ("nvidia.com/gpu",))
    assert under_cluster_strategy(profile, "") is profile  # not set in the ClusterPolicy: the config decides
    assert under_cluster_strategy(profile, "mixed") is profile
    mps = ProfileSpec("mps", (H100,), replicas=4)
    assert under_cluster_strategy(mps, "single") is mps
