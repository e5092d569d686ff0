"""sharing.nvidia_configs against the rules of mig-parted and the device plugin, case by case, each with the upstream
reason and the rule it comes from (docs/nvidia-contracts.md §2.1, §3.1)."""

import re

import pytest

from sharing import nvidia_configs as nc
from sharing.nvidia_configs import Rejected, device_filter_matches, mig_profile_format_error

MIG = "version: v1\nmig-configs:\n  c:\n    - "
CANNOT = "json: cannot unmarshal"

# (config text, mig-parted's reason or None when it accepts, the rule)
MIG_PARTED_CASES = [
    (MIG + "{devices: all, mig-enabled: false}", None, None),
    (MIG + "{devices: [], mig-enabled: false}", None, None),  # decodes as []int, matches no GPU
    (MIG + "{devices: [0, 0, 9], mig-enabled: false}", None, None),
    (MIG + '{devices: all, device-filter: "0x20B010DE", mig-enabled: false}', None, None),
    (MIG + "{devices: all, device-filter: ['0x20B010DE', '0x20B210DE:0x147E10DE'], mig-enabled: false}", None, None),
    (MIG + "{devices: all, device-filter: 'GH200', mig-enabled: false}", None, None),  # read, never parsed
    (MIG + "{devices: all, device-filter: 0x20B010DE, mig-enabled: false}", f"{CANNOT} number", nc.RULE_ENTRY),
    (MIG + "{devices: all, device-filter: [0x20B010DE], mig-enabled: false}", f"{CANNOT} number", nc.RULE_ENTRY),
    (MIG + "{devices: all, mig-enabled: true, mig-devices: {}}", None, None),
    (MIG + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb+me.all: 1, 1c.2g.20gb: 2}}", None, None),
    (MIG + "{devices: all, mig-enabled: true}", "missing required field 'mig-devices'", nc.RULE_ENTRY),
    (MIG + "{devices: all, mig-enabled: yes, mig-devices: {1g.10gb: 1}}", None, None),  # go-yaml v2: yes is true
    (MIG + "{devices: all, mig-enabled: 'true'}", f"{CANNOT} string into Go value of type bool", nc.RULE_ENTRY),
    (MIG + "{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}", "MIG devices included", nc.RULE_ENTRY),
    (MIG + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 0}}", "all counts for all MigProfiles are 0",
     nc.RULE_MIG_DEVICES),
    (MIG + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}", "invalid count", nc.RULE_MIG_DEVICES),
    (MIG + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 1.5}}", f"{CANNOT} number into Go value of "
     "type int", nc.RULE_ENTRY),
    (MIG + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb+me-x: 1}}", "contains both '+/-'",
     nc.RULE_PROFILE),
    (MIG + "{devices: all, mig-enabled: true, mig-devices: {1g.10g: 1}}", "missing 'gb'", nc.RULE_PROFILE),
    (MIG + "{devices: every, mig-enabled: false}", "invalid string input for 'devices': every", nc.RULE_ENTRY),
    (MIG + "{devices: 0, mig-enabled: false}", f"{CANNOT} number into Go value of type string", nc.RULE_ENTRY),
    (MIG + "{mig-enabled: false}", "missing required field: devices", nc.RULE_ENTRY),
    (MIG + "{devices: all, mig-enabled: false, mig_devices: {}}", "unexpected field: mig_devices", nc.RULE_ENTRY),
    ("version: v1\nmig-configs: {c: []}", "at least one entry in 'c' is required", nc.RULE_SPEC),
    ("version: v1\nmig-configs:", "at least one entry in 'mig-configs' is required", nc.RULE_SPEC),
    ("mig-configs: {}", "unable to parse with missing 'version' field", nc.RULE_SPEC),
    ("version: v2", "unknown version: v2", nc.RULE_SPEC),
    ("version: v1\nconfigs: {}", "unexpected field: configs", nc.RULE_SPEC),
    ("version: v1\nmig-configs: {~: [{devices: all, mig-enabled: false}]}", "unsupported map key", nc.RULE_YAML),
    ("version: [v1", "error converting YAML to JSON", nc.RULE_YAML),
]  # fmt: skip


@pytest.mark.parametrize(("text", "reason", "rule"), MIG_PARTED_CASES)
def test_mig_parted_acceptance(text, reason, rule):
    if reason is None:
        assert list(nc.read_mig_parted(text)) == ["c"]
        return
    with pytest.raises(Rejected, match=re.escape(reason)) as caught:
        nc.read_mig_parted(text)
    assert caught.value.rule == rule


def test_a_repeated_key_keeps_its_last_value_as_go_yaml_v2_does():
    text = (
        "version: v1\nmig-configs:\n  c: [{devices: all, mig-enabled: false}]\n  c: [{devices: [1], mig-enabled: no}]"
    )
    assert nc.read_mig_parted(text)["c"][0]["devices"] == (1,)


TS = "sharing:\n  timeSlicing:\n    resources:\n"
# (config text, the plugin's reason or None when it accepts, the rule)
PLUGIN_CASES = [
    ("", None, None),
    ("version: v1\nflags: {migStrategy: mixed}", None, None),
    ("flags: {migStrategy: mixed, unknownFlag: 1}\nextra: {}", None, None),  # unknown keys are read past
    (TS + "      - {name: nvidia.com/gpu, replicas: 4}", None, None),
    (TS + "      - {name: gpu, replicas: 4, devices: [0, '1:0'], rename: gpu-ts}", None, None),
    ("sharing: {mps: null}", None, None),  # a pointer: null leaves MPS unset
    ("sharing:\n  timeSlicing:\n", "no resources specified", nc.RULE_REPLICATED),  # a struct: decoded even when null
    ("sharing: {timeSlicing: {renameByDefault: true}}", "no resources specified", nc.RULE_REPLICATED),
    ("sharing: {mps: {resources: []}}", "no resources specified", nc.RULE_REPLICATED),
    (TS + "      - {replicas: 4}", "no resource name specified", nc.RULE_RESOURCE),
    (TS + "      - {name: nvidia.com/gpu}", "no replicas specified", nc.RULE_RESOURCE),
    (TS + "      - {name: nvidia.com/gpu, replicas: 1}", "number of replicas must be >= 2", nc.RULE_RESOURCE),
    (TS + "      - {name: nvidia.com/gpu, replicas: 2.5}", f"{CANNOT} number into Go value of type int",
     nc.RULE_RESOURCE),
    (TS + "      - {name: nvidia.com/GPU, replicas: 2}", "incorrect format for resource name", nc.RULE_RESOURCE_NAME),
    (TS + "      - {name: nvidia.com/gpu, replicas: 2, devices: 0}", "a count of devices must be > 0",
     nc.RULE_DEVICES),
    (TS + "      - {name: nvidia.com/gpu, replicas: 2, devices: null}", "devices set as '' but the only valid string "
     "input is 'all'", nc.RULE_DEVICES),
    (TS + "      - {name: nvidia.com/gpu, replicas: 2, devices: [gpu0]}", "unsupported type for device",
     nc.RULE_DEVICES),
    ("sharing: {timeSlicing: {failRequestsGreaterThanOne: 'no', resources: []}}", f"{CANNOT} string",
     nc.RULE_REPLICATED),
    ("version: v2", "unknown version: v2", nc.RULE_PLUGIN_FILE),
    ("flags: {failOnInitError: 'yes'}", f"{CANNOT} string into Go value of type bool", nc.RULE_PLUGIN_FILE),
    ("flags: [", "error converting YAML to JSON", nc.RULE_YAML),
]  # fmt: skip


@pytest.mark.parametrize(("text", "reason", "rule"), PLUGIN_CASES)
def test_device_plugin_acceptance(text, reason, rule):
    if reason is None:
        assert isinstance(nc.read_device_plugin(text), nc.PluginConfig)
        return
    with pytest.raises(Rejected, match=re.escape(reason)) as caught:
        nc.read_device_plugin(text)
    assert caught.value.rule == rule


def test_what_the_plugin_reads_past_is_noted():
    config = nc.read_device_plugin(TS + "      - {name: gpu, replicas: 4, rename: gpu-ts}\nimex: {required: true}")
    assert config.time_slicing.resources == (nc.ReplicatedResource("nvidia.com/gpu", 4),)
    assert any("rename: ignored by the plugin" in note for note in config.notes)
    assert any(note.startswith("imex:") for note in config.notes)


@pytest.mark.parametrize(
    ("text", "cluster_strategy", "reason"),
    [
        ("sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}", "mixed", "not supported with MPS"),
        ("flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}", "", "with MPS"),
        ("flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}", "single", None),
        ("flags: {migStrategy: half}", "", "unknown MIG strategy: half"),
        ("flags: {migStrategy: half}", "mixed", None),  # MIG_STRATEGY from the ClusterPolicy wins (§1.2)
    ],
)
def test_the_plugin_start_checks_use_the_clusters_strategy(text, cluster_strategy, reason):
    error = nc.plugin_start_error(nc.read_device_plugin(text), cluster_strategy)
    assert (error is None) == (reason is None)
    if reason:
        assert reason in str(error) and error.rule == nc.RULE_START


@pytest.mark.parametrize(
    ("device_filter", "device", "subsystem", "matches"),
    [
        ((), 0x20B010DE, None, True),
        (("0x20B010DE",), 0x20B010DE, None, True),
        (("0x20b010de",), 0x20B010DE, None, True),
        (("548409566",), 0x20B010DE, None, True),  # strconv.ParseUint(s, 0, 32): decimal too
        (("0x20B010DE:0x147E10DE",), 0x20B010DE, 0x147E10DE, True),
        (("0x20B010DE:0x147E10DE",), 0x20B010DE, 0x134F10DE, False),
        (("A100",), 0x20B010DE, None, False),  # unparsable: device 0, matches nothing
        (("", "0x233010DE"), 0x20B010DE, None, False),
    ],
)
def test_device_filter_matching(device_filter, device, subsystem, matches):
    assert device_filter_matches(device_filter, device, subsystem) is matches


@pytest.mark.parametrize(
    ("profile", "problem"),
    [
        ("1g.10gb", ""),
        ("1c.3g.40gb", ""),
        ("1g.24gb-me", ""),
        ("2g.48gb+gfx", ""),
        ("1g.10gb+me.all", ""),
        ("1g.10gb+me,gfx", ""),
        ("", "profile is the empty string"),
        ("1g.10gb+me,me", "non unique attribute"),
        ("1g.10gb+9x", "attribute begins with a number"),
        ("1g", "expected 2 or 3"),
        ("xg.10gb", "malformed number in '%dg'"),
    ],
)
def test_mig_profile_format_as_go_nvlib(profile, problem):
    error = mig_profile_format_error(profile)
    assert problem in error if problem else error == ""


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a: y", {"a": True}),
        ("a: n", {"a": False}),
        ("a: 2024-01-01", {"a": "2024-01-01"}),  # go-yaml v2 keeps timestamps as strings
        ("a: 0x1F", {"a": 31}),
        ("a: 017", {"a": 15}),
        ("1: x", {"1": "x"}),
        ("true: x", {"true": "x"}),
        ("a: .", {"a": "."}),
    ],
)
def test_yaml_reads_as_go_yaml_v2(text, value):
    assert nc.load_yaml(text) == value
