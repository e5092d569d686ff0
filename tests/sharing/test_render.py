"""NVIDIA config renderers and parsers: golden files, round trips and the parsers' refusals (§2.1, §3.1, §3.4)."""

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sharing.mig import PRODUCTS
from sharing.render import (
    DevicePluginSpec,
    MigDeviceSpec,
    content_name,
    parse_device_plugin_config,
    parse_mig_parted_config,
    render_device_plugin_config,
    render_mig_parted_config,
)

GOLDEN = Path(__file__).parent / "golden"

MIG_PARTED_CASES = {
    "mig_parted_all_disabled": {"all-disabled": [MigDeviceSpec("all", False)]},
    "mig_parted_uniform": {"day-inference": [MigDeviceSpec("all", True, {"1g.10gb": 7})]},
    "mig_parted_heterogeneous": {
        "night-training": [
            MigDeviceSpec((0, 1, 2, 3), False),
            MigDeviceSpec((4, 5), True, {"3g.40gb": 2}, ("0x233010DE",)),
            MigDeviceSpec((7, 6), True, {"1g.10gb": 1, "4g.40gb": 1, "2g.20gb": 1}, ("0x233010DE", "0x20B210DE")),
        ],
        "empty-slices": [MigDeviceSpec("all", True, {}, ("0x20B710DE",))],
    },
}

DEVICE_PLUGIN_CASES = {
    "device_plugin_none": DevicePluginSpec(mig_strategy="none"),
    "device_plugin_time_slicing": DevicePluginSpec(
        "none", "time_slicing", replicas=4, rename_by_default=True, fail_requests_greater_than_one=True
    ),
    # Tessera writes MPS's failRequestsGreaterThanOne out: absent, the plugin takes it as true (§3.3).
    "device_plugin_mps": DevicePluginSpec(
        "none", "mps", replicas=8, rename_by_default=False, fail_requests_greater_than_one=False
    ),
    "device_plugin_mixed_mig": DevicePluginSpec(
        "mixed", "time_slicing", replicas=2, resources=("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb")
    ),
}


# --- golden files ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", MIG_PARTED_CASES)
def test_mig_parted_golden(case):
    assert render_mig_parted_config(MIG_PARTED_CASES[case]) == (GOLDEN / f"{case}.yaml").read_text()


@pytest.mark.parametrize("case", DEVICE_PLUGIN_CASES)
def test_device_plugin_golden(case):
    assert render_device_plugin_config(DEVICE_PLUGIN_CASES[case]) == (GOLDEN / f"{case}.yaml").read_text()


def test_mig_parted_output_has_the_section_2_1_shape():
    data = yaml.safe_load(render_mig_parted_config(MIG_PARTED_CASES["mig_parted_heterogeneous"]))
    assert data == {
        "version": "v1",
        "mig-configs": {
            "empty-slices": [
                {"devices": "all", "device-filter": ["0x20B710DE"], "mig-enabled": True, "mig-devices": {}},
            ],
            "night-training": [
                {"devices": [0, 1, 2, 3], "mig-enabled": False},
                {
                    "devices": [4, 5],
                    "device-filter": ["0x233010DE"],
                    "mig-enabled": True,
                    "mig-devices": {"3g.40gb": 2},
                },
                {
                    "devices": [6, 7],
                    "device-filter": ["0x233010DE", "0x20B210DE"],
                    "mig-enabled": True,
                    "mig-devices": {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
                },
            ],
        },
    }


def test_device_plugin_output_has_the_section_3_1_shape():
    assert yaml.safe_load(render_device_plugin_config(DEVICE_PLUGIN_CASES["device_plugin_mixed_mig"])) == {
        "version": "v1",
        "flags": {"migStrategy": "mixed"},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": False,
                "resources": [
                    {"name": "nvidia.com/mig-1g.10gb", "replicas": 2},
                    {"name": "nvidia.com/mig-2g.20gb", "replicas": 2},
                ],
            }
        },
    }


def test_rendering_ignores_input_order():
    one = {"b": [MigDeviceSpec("all", True, {"1g.10gb": 2, "3g.40gb": 1})], "a": [MigDeviceSpec([1, 0], False)]}
    two = {"a": [MigDeviceSpec([0, 1], False)], "b": [MigDeviceSpec("all", True, {"3g.40gb": 1, "1g.10gb": 2})]}
    assert render_mig_parted_config(one) == render_mig_parted_config(two)


@pytest.mark.parametrize("name", ["true", "123", "0x1F", "null", "1.5", "yes"])
def test_config_names_yaml_would_misread_are_quoted(name):
    text = render_mig_parted_config({name: [MigDeviceSpec("all", False)]})
    assert f'"{name}":' in text
    assert list(parse_mig_parted_config(text)) == [name]


# --- round trips -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", MIG_PARTED_CASES)
def test_mig_parted_round_trip(case):
    configs = MIG_PARTED_CASES[case]
    assert parse_mig_parted_config(render_mig_parted_config(configs)) == configs


@pytest.mark.parametrize("case", DEVICE_PLUGIN_CASES)
def test_device_plugin_round_trip(case):
    spec = DEVICE_PLUGIN_CASES[case]
    assert parse_device_plugin_config(render_device_plugin_config(spec)) == spec


PROFILE_NAMES = sorted({profile.name for product in PRODUCTS.values() for profile in product.profiles})
config_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9_.]{0,20}[a-z0-9])?\Z")
mig_specs = st.builds(
    MigDeviceSpec,
    devices=st.one_of(st.just("all"), st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True)),
    mig_enabled=st.just(False),
    device_filter=st.lists(st.sampled_from(["0x233010DE", "0x20B210DE", "0x20B710DE:0x145110DE"]), max_size=2),
) | st.builds(
    MigDeviceSpec,
    devices=st.one_of(st.just("all"), st.lists(st.integers(0, 15), min_size=1, max_size=8, unique=True)),
    mig_enabled=st.just(True),
    mig_devices=st.dictionaries(st.sampled_from(PROFILE_NAMES), st.integers(1, 7), max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(config_names, st.lists(mig_specs, min_size=1, max_size=3), min_size=1, max_size=4))
def test_any_mig_parted_config_round_trips(configs):
    text = render_mig_parted_config(configs)
    assert parse_mig_parted_config(text) == configs
    assert render_mig_parted_config(parse_mig_parted_config(text)) == text


device_plugin_specs = st.one_of(
    st.builds(DevicePluginSpec, mig_strategy=st.sampled_from(["none", "single", "mixed"])),
    st.builds(
        DevicePluginSpec,
        mig_strategy=st.sampled_from(["none", "single"]),
        sharing=st.sampled_from(["time_slicing", "mps"]),
        replicas=st.integers(2, 48),
        rename_by_default=st.booleans(),
        fail_requests_greater_than_one=st.sampled_from([None, True, False]),
    ),
    st.builds(
        DevicePluginSpec,
        mig_strategy=st.just("mixed"),
        sharing=st.just("time_slicing"),
        replicas=st.integers(2, 64),
        rename_by_default=st.booleans(),
        fail_requests_greater_than_one=st.sampled_from([None, True, False]),
        resources=st.lists(
            st.sampled_from(["nvidia.com/gpu"] + [f"nvidia.com/mig-{n.replace('+', '.')}" for n in PROFILE_NAMES]),
            min_size=1,
            max_size=4,
            unique=True,
        ).map(tuple),
    ),
)


@settings(max_examples=200, deadline=None)
@given(device_plugin_specs)
def test_any_device_plugin_config_round_trips(spec):
    assert parse_device_plugin_config(render_device_plugin_config(spec)) == spec


# --- real-world inputs -------------------------------------------------------------------------------------------


def test_parses_the_section_2_1_example():
    text = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  day-inference:                # 7 small slices on every GPU
    - devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
  night-training:               # MIG off on GPUs 0-5, big slices on 6-7
    - devices: [0,1,2,3,4,5]
      mig-enabled: false
    - devices: [6,7]
      mig-enabled: true
      mig-devices: {"4g.40gb": 1, "3g.40gb": 1}
"""
    assert parse_mig_parted_config(text) == {
        "all-disabled": [MigDeviceSpec("all", False)],
        "day-inference": [MigDeviceSpec("all", True, {"1g.10gb": 7})],
        "night-training": [
            MigDeviceSpec((0, 1, 2, 3, 4, 5), False),
            MigDeviceSpec((6, 7), True, {"4g.40gb": 1, "3g.40gb": 1}),
        ],
    }


def test_parses_operator_style_entries():
    # The GPU Operator's default config: a single device-filter string, unquoted profile names, +me, mig-devices {}.
    text = """
version: v1
mig-configs:
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-1g.10gb.me:
    - devices: all
      mig-enabled: true
      mig-devices:
        1g.10gb+me: 1
  all-balanced:
    - device-filter: "0x20B710DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.6gb": 2
        "2g.12gb": 1
    - device-filter: "0x233010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
"""
    configs = parse_mig_parted_config(text)
    assert configs["all-enabled"] == [MigDeviceSpec("all", True, {})]
    assert configs["all-1g.10gb.me"] == [MigDeviceSpec("all", True, {"1g.10gb+me": 1})]
    assert [spec.device_filter for spec in configs["all-balanced"]] == [("0x20B710DE",), ("0x233010DE",)]


def test_parses_the_section_3_4_configmap_entries():
    entries = {
        "whole": "version: v1\nflags: {migStrategy: none}",
        "ts-4": (
            "version: v1\nflags: {migStrategy: none}\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n"
            "    resources: [{name: nvidia.com/gpu, replicas: 4}]"
        ),
        "mps-4": (
            "version: v1\nflags: {migStrategy: none}\nsharing:\n  mps:\n"
            "    resources: [{name: nvidia.com/gpu, replicas: 4}]"
        ),
        "mig-mixed": "version: v1\nflags: {migStrategy: mixed}",
    }
    assert {key: parse_device_plugin_config(text) for key, text in entries.items()} == {
        "whole": DevicePluginSpec("none"),
        "ts-4": DevicePluginSpec("none", "time_slicing", 4, fail_requests_greater_than_one=True),
        "mps-4": DevicePluginSpec("none", "mps", 4),
        "mig-mixed": DevicePluginSpec("mixed"),
    }


def test_device_plugin_keys_tessera_does_not_model_are_accepted():
    text = """
flags:
  migStrategy: none
  failOnInitError: true
  mpsRoot: /run/nvidia/mps
  plugin: {passDeviceSpecs: false, deviceListStrategy: [envvar, cdi-annotations], deviceIDStrategy: uuid}
  gfd: {oneshot: false, sleepInterval: 60s}
resources: {gpus: [{pattern: "*", name: gpu}]}
imex: {channelIDs: [], required: false}
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 10
        rename: gpu.ts
        devices: all
"""
    assert parse_device_plugin_config(text) == DevicePluginSpec("none", "time_slicing", 10)


def test_an_empty_device_plugin_config_means_the_defaults():
    assert parse_device_plugin_config("") == parse_device_plugin_config("version: v1\n") == DevicePluginSpec()


# --- refusals ----------------------------------------------------------------------------------------------------

ENTRY = "version: v1\nmig-configs:\n  c:\n    - "
CANNOT = "json: cannot unmarshal"


# Refusals in mig-parted's own words (api/spec/v1/spec.go, pkg/types/mig_config.go, go-nvlib's parseMigProfile at
# the commits of nvidia-contracts.md); the table of sharing/nvidia_configs is tests/sharing/test_nvidia_configs.py.
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mig-configs: {c: [{devices: all, mig-enabled: false}]}", "unable to parse with missing 'version' field"),
        ("version: v2\nmig-configs: {c: [{devices: all, mig-enabled: false}]}", "unknown version: v2"),
        ("", "unknown version: $"),
        ("version: v1\nmig-configs: {}", "at least one entry in 'mig-configs' is required"),
        ("version: v1\nmig-configs: {c: []}", "at least one entry in 'c' is required"),
        ("version: v1\nextra: 1\nmig-configs: {c: [{devices: all, mig-enabled: false}]}", "unexpected field: extra"),
        (
            ENTRY + "{devices: all, mig-enabled: false, mig-device: {}}",
            r"mig-configs.c\[0\]: unexpected field: mig-device",
        ),
        (ENTRY + "{mig-enabled: false}", "missing required field: devices"),
        (ENTRY + "{devices: all}", "missing required field: mig-enabled"),
        (ENTRY + "{devices: all, mig-enabled: 1}", f"{CANNOT} number into Go value of type bool"),
        (
            ENTRY + "{devices: all, mig-enabled: true}",
            "missing required field 'mig-devices' when 'mig-enabled' is true",
        ),
        (
            ENTRY + "{devices: all, mig-enabled: false, mig-devices: {1g.10gb: 1}}",
            "MIG devices included when 'mig-enabled' is false",
        ),
        (ENTRY + "{devices: All, mig-enabled: false}", "invalid string input for 'devices': All"),
        (ENTRY + "{devices: [0, '1'], mig-enabled: false}", r"into Go value of type \[\]int"),
        (ENTRY + "{devices: all, mig-enabled: true, mig-devices: {10gb: 1}}", "invalid format for '10gb'"),
        (ENTRY + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb: -1}}", "invalid count for '-1'"),
        (
            ENTRY + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb: 0}}",
            "all counts for all MigProfiles are 0",
        ),
        (ENTRY + "{devices: all, device-filter: 0x20B010DE, mig-enabled: false}", f"{CANNOT} number into Go value"),
        ("version: v1\nmig-configs: [", "error converting YAML to JSON"),
        ("- version: v1", f"{CANNOT} array"),
    ],
)
def test_mig_parted_parser_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_mig_parted_config(text)


OFF = MigDeviceSpec("all", False)
TWICE = "version: v1\nmig-configs:\n  c: [{devices: all, mig-enabled: true, mig-devices: {}}]\n  c: ["


@pytest.mark.parametrize(
    ("text", "configs"),
    [
        (ENTRY + "{devices: [], mig-enabled: false}", {"c": [MigDeviceSpec((), False)]}),  # matches no GPU
        (ENTRY + "{devices: [1, 1], mig-enabled: false}", {"c": [MigDeviceSpec((1, 1), False)]}),
        (
            ENTRY + "{devices: all, device-filter: A100, mig-enabled: false}",
            {"c": [MigDeviceSpec("all", False, {}, ("A100",))]},
        ),
        (
            ENTRY + "{devices: all, mig-enabled: true, mig-devices: {1g.10gb+foo: 1}}",
            {"c": [MigDeviceSpec("all", True, {"1g.10gb+foo": 1})]},
        ),
        (TWICE + "{devices: all, mig-enabled: false}]", {"c": [OFF]}),  # a repeated key: the last one counts
        ("version: v1\nmig-configs: {1: [{devices: all, mig-enabled: false}]}", {"1": [OFF]}),
        ("version: v1\nmig-configs: {n: [{devices: all, mig-enabled: false}]}", {"false": [OFF]}),  # go-yaml v2
        ("version: v1", {}),
    ],
)
def test_mig_parted_parser_accepts_what_mig_parted_accepts(text, configs):
    assert parse_mig_parted_config(text) == configs


TS = "sharing:\n  timeSlicing:\n    resources:\n"


# Refusals of the plugin (api/config/v1/{config,replicas,resources}.go), then of Tessera's model (DevicePluginSpec).
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2", "unknown version: v2"),
        ("flags: {migStrategy: all}", "migStrategy must be none, single or mixed"),
        ("sharing: {timeSlicing: {}}", "no resources specified"),
        ("sharing: {timeSlicing: {renameByDefault: true}}", "no resources specified"),
        ("sharing: {timeslicing: {}}", "no resources specified"),  # struct fields match case-insensitively
        ("sharing:\n  timeSlicing:", "no resources specified"),
        ("sharing: {mps: {resources: []}}", "no resources specified"),
        (TS + "      - {name: nvidia.com/gpu, replicas: 1}", "number of replicas must be >= 2"),
        (TS + "      - {name: nvidia.com/gpu, replicas: '4'}", f"{CANNOT} string into Go value of type int"),
        (TS + "      - {name: nvidia.com/gpu}", "no replicas specified"),
        (TS + "      - {replicas: 4}", "no resource name specified"),
        (TS + "      - {name: Nvidia.com/GPU, replicas: 4}", "incorrect format for resource name"),
        (TS + "      - {name: nvidia.com/gpu, replicas: 4, devices: some}", "the only valid string input is 'all'"),
        (TS + "      - {name: nvidia.com/gpu, replicas: 4}\n      - {name: nvidia.com/gpu, replicas: 4}", "distinct"),
        (
            "flags: {migStrategy: mixed}\n" + TS + "      - {name: nvidia.com/gpu, replicas: 4}\n"
            "      - {name: nvidia.com/mig-1g.10gb, replicas: 2}",
            "every resource with the same replicas",
        ),
        (TS + "      - {name: nvidia.com/mig-1g.10gb, replicas: 4}", "exists only under migStrategy mixed"),
        (TS + "      - {name: foo, replicas: 4}", "'nvidia.com/foo' is not nvidia.com/gpu or a nvidia.com/mig"),
        (
            "flags: {migStrategy: mixed}\nsharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 4}]}",
            "MPS cannot be combined with MIG",
        ),
        ("sharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 49}]}", "at most 48 replicas"),
        (
            "sharing:\n  mps: {renameByDefault: 'yes please', resources: [{name: nvidia.com/gpu, replicas: 4}]}",
            f"{CANNOT} string into Go value of type bool",
        ),
        ("flags: [", "error converting YAML to JSON"),
    ],
)
def test_device_plugin_parser_refuses(text, message):
    with pytest.raises(ValueError, match=message):
        parse_device_plugin_config(text)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("versions: v1", DevicePluginSpec()),  # unknown keys are read past (encoding/json)
        ("flags: {strategy: mixed, plugin: {deviceIdStrategy: uuid}}", DevicePluginSpec()),
        ("flags: {MIGSTRATEGY: mixed}", DevicePluginSpec("mixed")),  # struct fields match case-insensitively
        ("sharing: {mps: null}", DevicePluginSpec()),
        (TS + "      - {name: gpu, replicas: 4, weight: 1}", DevicePluginSpec("none", "time_slicing", 4)),
        (
            "sharing:\n  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
            "  mps: {resources: [{name: nvidia.com/gpu, replicas: 3}]}",
            DevicePluginSpec("none", "mps", 3),  # sharing.go SharingStrategy: MPS wins
        ),
    ],
)
def test_device_plugin_parser_accepts_what_the_plugin_accepts(text, spec):
    assert parse_device_plugin_config(text) == spec


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 4}, "need a sharing method"),
        ({"sharing": "time_slicing", "replicas": 1}, "replicas ≥ 2"),
        ({"sharing": "timeslicing", "replicas": 4}, "sharing must be time_slicing, mps or None"),
        ({"sharing": "time_slicing", "replicas": 4, "resources": ()}, "distinct resources"),
    ],
)
def test_device_plugin_spec_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DevicePluginSpec(**kwargs)


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({}, "at least one named config"),
        ({"day": []}, "needs at least one device entry"),
        ({"Day Shift": [MigDeviceSpec("all", False)]}, "not a Kubernetes label value"),
        ({"-day": [MigDeviceSpec("all", False)]}, "not a Kubernetes label value"),
        ({"d" * 64: [MigDeviceSpec("all", False)]}, "not a Kubernetes label value"),
    ],
)
def test_mig_parted_renderer_refuses(configs, message):
    with pytest.raises(ValueError, match=message):
        render_mig_parted_config(configs)


# --- content-addressed names -------------------------------------------------------------------------------------


def test_content_names_are_stable_and_distinct():
    texts = [render_device_plugin_config(spec) for spec in DEVICE_PLUGIN_CASES.values()]
    names = [content_name("tessera-dp-", text) for text in texts]
    assert names == [content_name("tessera-dp-", text) for text in texts]
    assert len(set(names)) == len(names)
    for name in names:
        assert re.fullmatch(r"tessera-dp-[0-9a-f]{10}", name)


def test_content_name_ignores_line_endings_and_trailing_newlines():
    text = render_mig_parted_config(MIG_PARTED_CASES["mig_parted_uniform"])
    name = content_name("tessera-mig-", text)
    assert (
        name == content_name("tessera-mig-", text.replace("\n", "\r\n")) == content_name("tessera-mig-", text + "\n\n")
    )
    assert name != content_name("tessera-mig-", text.replace("7", "6"))


@given(st.text())
def test_content_names_are_label_values_and_configmap_keys(text):
    name = content_name("tessera-mig-", text)
    assert len(name) <= 63
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name)  # label value, and a valid ConfigMap key


@pytest.mark.parametrize("prefix", ["Tessera-", "tessera_", "-x-", "x" * 60])
def test_content_name_refuses_prefixes_that_break_labels(prefix):
    with pytest.raises(ValueError, match="not a valid label value"):
        content_name(prefix, "version: v1\n")
