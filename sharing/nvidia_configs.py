"""mig-parted's and the device plugin's config files, accepted and refused exactly as those tools do.

Pure (no Django, no I/O). Both tools read YAML with sigs.k8s.io/yaml (go-yaml v2, then encoding/json into Go
structs), so a file is judged as that chain judges it: a repeated key keeps its last value, an unquoted 0x20B010DE
is a number, unknown device-plugin keys are ignored, unknown mig-parted keys are errors. A refusal (`Rejected`)
carries the tool's own words and the upstream rule (file, function, commit) — docs/nvidia-contracts.md §2.1
(mig-parted) and §3.1 (device plugin) list the same facts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

MIG_PARTED_AT = "NVIDIA/mig-parted@bd7160f4"
DEVICE_PLUGIN_AT = "NVIDIA/k8s-device-plugin@1b826acc"
RULE_YAML = "sigs.k8s.io/yaml v1.6.0 yamlToJSONTarget on go-yaml v2 (vendored by both tools)"
RULE_SPEC = f"{MIG_PARTED_AT} api/spec/v1/spec.go Spec.UnmarshalJSON"
RULE_ENTRY = f"{MIG_PARTED_AT} api/spec/v1/spec.go MigConfigSpec.UnmarshalJSON"
RULE_MIG_DEVICES = f"{MIG_PARTED_AT} pkg/types/mig_config.go MigConfig.AssertValidFormat"
RULE_PROFILE = "NVIDIA/go-nvlib v0.12.0 pkg/nvlib/device/mig_profile.go parseMigProfile (vendored by mig-parted)"
RULE_SELECTED = f"{MIG_PARTED_AT} cmd/nvidia-mig-parted/assert/assert.go GetSelectedMigConfig"
RULE_PLUGIN_FILE = f"{DEVICE_PLUGIN_AT} api/config/v1/config.go parseConfigFrom"
RULE_REPLICATED = f"{DEVICE_PLUGIN_AT} api/config/v1/replicas.go ReplicatedResources.UnmarshalJSON"
RULE_RESOURCE = f"{DEVICE_PLUGIN_AT} api/config/v1/replicas.go ReplicatedResource.UnmarshalJSON"
RULE_DEVICES = f"{DEVICE_PLUGIN_AT} api/config/v1/replicas.go ReplicatedDevices.UnmarshalJSON"
RULE_RESOURCE_NAME = f"{DEVICE_PLUGIN_AT} api/config/v1/resources.go NewResourceName"
RULE_START = f"{DEVICE_PLUGIN_AT} cmd/nvidia-device-plugin/main.go validateFlags"
RULE_SELECTED_KEY = f"{DEVICE_PLUGIN_AT} cmd/config-manager/main.go (the selected key must exist)"
RULE_MPS_MIG = f"{DEVICE_PLUGIN_AT} internal/plugin/mps.go (MPS is not offered on MIG devices)"
RULE_BOUNDS = "Tessera (sharing.nvidia_configs: the bounds on YAML read from a cluster, docs/security.md)"

# What Tessera parses from a cluster (docs/security.md, "Bounds on cluster data"). Pure-Python YAML costs ~50 µs a
# value, so the values are counted as they are composed, aliases expanded (a 336-byte alias bomb is 9^8 of them),
# and the parse stops at the first one over. A mig-parted config is ~14 values: 20,000 is ~1,400 of them; 256 KiB
# is ~1,400 such configs as Tessera writes them. No name, filter or path in these files comes near 4,096
# characters, which also keeps a number's digits under Python's int limit (4,300).
YAML_MAX_CHARS = 256 * 1024
YAML_MAX_VALUES = 20_000
YAML_MAX_DEPTH = 64
YAML_MAX_SCALAR = 4096


class Rejected(ValueError):
    """A config NVIDIA's component refuses: its reason, in its words, and where the rule lives upstream."""

    def __init__(self, message: str, rule: str):
        super().__init__(message)
        self.rule = rule


# ---------------------------------------------------------------------------------------------------------------
# YAML as sigs.k8s.io/yaml reads it
# ---------------------------------------------------------------------------------------------------------------


class _GoYamlV2Loader(yaml.SafeLoader):
    """Plain scalars resolved as go-yaml v2 resolves them (resolve.go): y/n/yes/on… are booleans, no timestamps
    (v2 keeps them as strings), ints as strconv.ParseInt(s, 0, 64) reads them. Repeated keys keep the last value,
    as v2 does outside strict mode (decode.go: the 'already set' check is strict-only).

    Composed within the bounds above: nesting depth, scalar length, and values counted with each alias expanded
    (an alias counts all the values of the node it names); an alias inside its own anchor is refused as go-yaml v2
    refuses it."""

    yaml_implicit_resolvers: dict = {}

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._values = 0
        self._open_anchors: set[str] = set()
        self._weight: dict[int, int] = {}  # id(node) -> its values, aliases expanded (nodes live as long as this)

    def construct_yaml_bool(self, node):
        return self.construct_scalar(node) in _TRUE

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise Rejected(f"anchor '{event.anchor}' value contains itself", RULE_YAML)
            node = super().compose_node(parent, index)
            self._count(self._weight.get(id(node), 1), event)
            return node
        if self._depth >= YAML_MAX_DEPTH:
            raise _bound(f"nests deeper than {YAML_MAX_DEPTH} levels", event)
        if isinstance(event, yaml.ScalarEvent) and len(event.value) > YAML_MAX_SCALAR:
            raise _bound(f"has a value longer than {YAML_MAX_SCALAR:,} characters", event)
        self._depth += 1
        if event.anchor:
            self._open_anchors.add(event.anchor)
        node = super().compose_node(parent, index)
        self._open_anchors.discard(event.anchor)
        self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            weight = 1 + sum(self._weight[id(item)] for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            weight = 1 + sum(self._weight[id(key)] + self._weight[id(value)] for key, value in node.value)
        else:
            weight = 1
        self._weight[id(node)] = weight
        self._count(1, event)  # the node's own; its items counted themselves
        return node

    def _count(self, values: int, event) -> None:
        self._values += values
        if self._values > YAML_MAX_VALUES:
            raise _bound(f"holds more than {YAML_MAX_VALUES:,} values, aliases expanded", event)


def _bound(what: str, event) -> Rejected:
    return Rejected(f"the file {what} (line {event.start_mark.line + 1}); Tessera reads no more from a cluster",
                    RULE_BOUNDS)  # fmt: skip


_TRUE = {"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"}
_FALSE = {"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"}
for _tag, _pattern, _first in (
    ("bool", "|".join(sorted(_TRUE | _FALSE)), "yYtTnNfFoO"),
    ("null", r"~|null|Null|NULL|", ["~", "n", "N", ""]),
    ("int", r"[-+]?(?:0b[01_]+|0x[0-9a-fA-F_]+|0o[0-7_]+|0[0-7_]*|[1-9][0-9_]*)", "-+0123456789"),
    (
        "float",
        r"[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*|[0-9][0-9_]*(?=[eE]))(?:[eE][-+]?[0-9]+)?",
        "-+.0123456789",
    ),
    ("float", r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", "-+."),
    ("merge", r"<<", "<"),
):
    _GoYamlV2Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"), list(_first))
_GoYamlV2Loader.add_constructor("tag:yaml.org,2002:bool", _GoYamlV2Loader.construct_yaml_bool)


def load_yaml(text: str) -> Any:
    """The JSON value sigs.k8s.io/yaml makes of `text`: map keys become strings as it converts them. Within the
    bounds above, else Rejected, as is any text the parser fails on."""
    if len(text) > YAML_MAX_CHARS:
        raise Rejected(f"the file is {len(text):,} characters, over {YAML_MAX_CHARS:,}; Tessera reads no more from "
                       "a cluster", RULE_BOUNDS)  # fmt: skip
    return _jsonable(_parsed(text))


@functools.lru_cache(maxsize=8)  # ~1.2 MB each at 20,000 values
def _parsed(text: str) -> Any:
    """The parsed text, shared by every caller of the same text (the import preview and each step of a rollout
    read the same ConfigMap): load_yaml hands out copies (_jsonable), never this."""
    try:
        return yaml.load(text, Loader=_GoYamlV2Loader)  # noqa: S506 - a SafeLoader subclass
    except Rejected:
        raise
    except yaml.YAMLError as error:
        raise Rejected(f"error converting YAML to JSON: {error}", RULE_YAML) from None
    except (ValueError, RecursionError, OverflowError) as error:  # a safety net: the bounds should keep these away
        raise Rejected(f"error converting YAML to JSON: {type(error).__name__}: {error}", RULE_YAML) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {_json_key(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_jsonable(item) for item in value]
    return value


def _json_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return {float("inf"): ".inf", float("-inf"): "-.inf"}.get(key, ".nan" if key != key else repr(key))
    if isinstance(key, str):
        return key
    raise Rejected(f"error converting YAML to JSON: unsupported map key of type: {_go_type(key)}", RULE_YAML)


def _go_type(value: Any) -> str:
    """How encoding/json names a JSON value it cannot unmarshal."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def _cannot(value: Any, into: str, rule: str) -> Rejected:
    return Rejected(f"json: cannot unmarshal {_go_type(value)} into Go value of type {into}", rule)


def _json_int(value: Any) -> int | None:
    """A JSON number Go's encoding/json stores in an int (1.0 is written 1 by json.Marshal), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


# ---------------------------------------------------------------------------------------------------------------
# mig-parted (contracts §2.1)
# ---------------------------------------------------------------------------------------------------------------


def read_mig_parted(text: str) -> dict[str, list[dict[str, Any]]]:
    """Every named config of a mig-parted file as mig-parted accepts it; raises Rejected as it refuses.

    Each entry is {"devices": "all" | tuple of ints, "device_filter": tuple of strings, "mig_enabled": bool,
    "mig_devices": {profile: count}} — `devices: []` (matches no GPU) and filters that name no GPU are accepted."""
    data = load_yaml(text)
    if data is None:
        data = {}  # JSON null leaves the map empty; the version check below refuses it
    if not isinstance(data, dict):
        raise _cannot(data, "map[string]json.RawMessage", RULE_SPEC)
    if data and "version" not in data:
        raise Rejected("unable to parse with missing 'version' field", RULE_SPEC)
    version = data.get("version") or ""
    if not isinstance(version, str):
        raise _cannot(version, "string", RULE_SPEC)
    if version != "v1":
        raise Rejected(f"unknown version: {version}", RULE_SPEC)
    unexpected = [key for key in data if key not in ("version", "mig-configs")]
    if unexpected:
        raise Rejected(f"unexpected field: {unexpected[0]}", RULE_SPEC)
    if "mig-configs" not in data:
        return {}
    configs = data["mig-configs"]
    if configs is not None and not isinstance(configs, dict):
        raise _cannot(configs, "map[string]v1.MigConfigSpecSlice", RULE_SPEC)
    if not configs:
        raise Rejected("at least one entry in 'mig-configs' is required", RULE_SPEC)
    parsed = {}
    for name, entries in configs.items():
        if entries is not None and not isinstance(entries, list):
            raise _cannot(entries, "v1.MigConfigSpecSlice", RULE_SPEC)
        if not entries:
            raise Rejected(f"at least one entry in '{name}' is required", RULE_SPEC)
        parsed[name] = [_located(read_mig_entry, entry, f"mig-configs.{name}[{i}]") for i, entry in enumerate(entries)]
    return parsed


def _located(read, value: Any, where: str):
    """`read(value)`, its refusal prefixed with where in the file it happened (the tools' own text follows)."""
    try:
        return read(value)
    except Rejected as error:
        raise Rejected(f"{where}: {error}", error.rule) from None


def read_mig_entry(entry: Any) -> dict[str, Any]:
    """One entry of a named config, as MigConfigSpec.UnmarshalJSON reads it."""
    if entry is None:
        entry = {}
    if not isinstance(entry, dict):
        raise _cannot(entry, "map[string]json.RawMessage", RULE_ENTRY)
    for required in ("devices", "mig-enabled"):
        if required not in entry:
            raise Rejected(f"missing required field: {required}", RULE_ENTRY)
    unexpected = [key for key in entry if key not in ("device-filter", "devices", "mig-enabled", "mig-devices")]
    if unexpected:
        raise Rejected(f"unexpected field: {unexpected[0]}", RULE_ENTRY)
    enabled = entry["mig-enabled"]
    if enabled is not None and not isinstance(enabled, bool):
        raise _cannot(enabled, "bool", RULE_ENTRY)
    enabled = bool(enabled)  # JSON null leaves the Go bool false
    devices = entry.get("mig-devices")
    if devices is not None:
        devices = check_mig_devices(enabled, devices)
    if enabled and devices is None:
        raise Rejected("missing required field 'mig-devices' when 'mig-enabled' is true", RULE_ENTRY)
    return {
        "devices": check_devices(entry["devices"]),
        "device_filter": check_device_filter(entry.get("device-filter")),
        "mig_enabled": enabled,
        "mig_devices": devices or {},
    }


def check_devices(devices: Any) -> str | tuple[int, ...]:
    """`devices`: the string "all" or anything that decodes as []int — `[]` included (it matches no GPU)."""
    if devices is None or isinstance(devices, str):  # null decodes as the empty string
        if devices != "all":
            raise Rejected(f"invalid string input for 'devices': {devices or ''}", RULE_ENTRY)
        return "all"
    if isinstance(devices, list | tuple):
        indices = [0 if item is None else _json_int(item) for item in devices]  # null leaves the int 0
        if None not in indices:
            return tuple(indices)
    raise Rejected(
        f"(json: cannot unmarshal {_go_type(devices)} into Go value of type string, "
        f"json: cannot unmarshal {_go_type(devices)} into Go value of type []int)",
        RULE_ENTRY,
    )


def check_device_filter(device_filter: Any) -> tuple[str, ...]:
    """`device-filter`: a string or a list of strings, read but not parsed (an unquoted 0x… is a number: refused)."""
    if device_filter is None or device_filter == "":
        return ()
    if isinstance(device_filter, str):
        return (device_filter,)
    if isinstance(device_filter, list | tuple) and all(item is None or isinstance(item, str) for item in device_filter):
        return tuple(item or "" for item in device_filter)
    kind = _go_type(device_filter)
    if isinstance(device_filter, list | tuple):
        kind = _go_type(next(item for item in device_filter if not isinstance(item, str | None)))
    raise Rejected(
        f"(json: cannot unmarshal {_go_type(device_filter)} into Go value of type string, "
        f"json: cannot unmarshal {kind} into Go value of type []string)",
        RULE_ENTRY,
    )


def check_mig_devices(mig_enabled: bool, mig_devices: Any) -> dict[str, int]:
    """`mig-devices`: profile → count, profiles in go-nvlib's format, counts ≥ 0 and not all 0; empty unless
    `mig-enabled`. Returns the map in its given order."""
    if not isinstance(mig_devices, Mapping):
        raise _cannot(mig_devices, "types.MigConfig", RULE_ENTRY)
    counts = {}
    for name, count in mig_devices.items():
        value = 0 if count is None else _json_int(count)
        if value is None:
            raise _cannot(count, "int", RULE_ENTRY)
        problem = mig_profile_format_error(str(name))
        if problem:
            raise Rejected(f"error validating values in 'mig-devices' field: invalid format for '{name}': {problem}",
                           RULE_PROFILE)  # fmt: skip
        if value < 0:
            raise Rejected(f"error validating values in 'mig-devices' field: invalid count for '{value}'",
                           RULE_MIG_DEVICES)  # fmt: skip
        counts[str(name)] = value
    if counts and not any(counts.values()):
        raise Rejected("error validating values in 'mig-devices' field: all counts for all MigProfiles are 0",
                       RULE_MIG_DEVICES)  # fmt: skip
    if counts and not mig_enabled:
        raise Rejected("MIG devices included when 'mig-enabled' is false", RULE_ENTRY)
    return counts


def _go_atoi(text: str) -> bool:
    return re.fullmatch(r"[-+]?[0-9]+", text) is not None


def mig_profile_format_error(profile: str) -> str:
    """Why go-nvlib's parseMigProfile refuses this name (its words), or "" when the format is valid: [<c>c.]<g>g.
    <mem>gb, then +attr[,attr…] or -attr[,attr…]. Whether a GPU has the profile is decided when it is applied."""
    if profile == "":
        return "profile is the empty string"
    plus, minus = profile.split("+", 1), profile.split("-", 1)
    if len(plus) == 2 and len(minus) == 2:
        return f"profile '{profile}' contains both '+/-' attributes"
    parts = plus if len(plus) == 2 else minus
    fields = parts[0].split(".", 2)
    if len(fields) not in (2, 3):
        return f"cannot parse fields of '{profile}': parsed wrong number of fields, expected 2 or 3"
    for field, suffix in zip(fields, ("c", "g", "gb")[3 - len(fields) :], strict=True):
        if field.strip() != field:
            return f"cannot parse fields of '{profile}': leading or trailing spaces on '%d{suffix}'"
        if not field.endswith(suffix):
            return f"cannot parse fields of '{profile}': missing '{suffix}' from '%d{suffix}'"
        if not _go_atoi(field[: -len(suffix)]):
            return f"cannot parse fields of '{profile}': malformed number in '%d{suffix}'"
    if len(parts) == 2:
        seen = set()
        for attribute in parts[1].split(","):
            problem = _attribute_error(attribute, seen)
            if problem:
                return f"cannot parse attributes of '{profile}': {problem}"
            seen.add(attribute)
    return ""


def _attribute_error(attribute: str, seen: set[str]) -> str:
    if attribute in seen:
        return "non unique attribute in list"
    if attribute == "":
        return "empty attribute in list"
    if attribute.strip() != attribute:
        return "leading or trailing spaces in attribute"
    if attribute[0].isdigit():
        return "attribute begins with a number"
    if attribute[0] == "." or attribute[-1] == ".":
        return "attribute begins/ends with a dot"
    if re.fullmatch(r"[A-Za-z0-9.]+", attribute) is None:
        return "non alpha-numeric character or digit in attribute"
    return ""


def _go_parse_uint32(text: str) -> int | None:
    """strconv.ParseUint(text, 0, 32): 0x, 0o, 0b prefixes, a leading 0 for octal, no sign; None when it fails."""
    if text.strip() != text or text.startswith(("-", "+")):
        return None
    if re.fullmatch(r"0[0-7_]+", text):
        text = "0o" + text[1:]
    try:
        value = int(text, 0)
    except ValueError:
        return None
    return value if value < 2**32 else None


def _device_id(text: str) -> tuple[int, int | None]:
    """NewDeviceIDFromString: <device><vendor>[:<subdevice><subvendor>]; what it cannot parse reads as device 0."""
    parts = text.split(":")
    primary = _go_parse_uint32(parts[0]) if len(parts) <= 2 else None
    subsystem = _go_parse_uint32(parts[1]) if len(parts) == 2 else None
    if primary is None or (len(parts) == 2 and subsystem is None):
        return 0, None
    return primary, subsystem


def device_filter_matches(device_filter: Sequence[str], device_id: int, subsystem_id: int | None = None) -> bool:
    """Whether mig-parted applies an entry with this filter to a GPU whose PCI config space reads `device_id`
    (<device><vendor>) and `subsystem_id`. No filter matches every GPU; a filter naming a subsystem needs it too;
    a string mig-parted cannot parse stands for device 0 (helpers.go MatchesDeviceFilter drops the parse error)."""
    if not device_filter:
        return True
    for item in device_filter:
        primary, subsystem = _device_id(item)
        if primary == device_id and (subsystem is None or subsystem == subsystem_id):
            return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# k8s-device-plugin (contracts §3.1)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicatedResource:
    """One resource shared by time-slicing or MPS: its name (nvidia.com/ added when missing) and replicas."""

    name: str
    replicas: int


@dataclass(frozen=True)
class Replicated:
    """A `sharing.timeSlicing` or `sharing.mps` block as the plugin reads it (replicas.go)."""

    rename_by_default: bool
    fail_requests_greater_than_one: bool | None  # None: absent (time-slicing: false; MPS: true from v0.20.0)
    resources: tuple[ReplicatedResource, ...]


@dataclass(frozen=True)
class PluginConfig:
    """One device-plugin config file as the plugin reads it."""

    mig_strategy: str | None = None  # flags.migStrategy as written; MIG_STRATEGY from the ClusterPolicy wins
    time_slicing: Replicated | None = None
    mps: Replicated | None = None
    notes: tuple[str, ...] = ()  # what the plugin reads past, and what it uses that Tessera does not model

    @property
    def sharing(self) -> str | None:
        """The active method (sharing.go SharingStrategy): MPS when it has a block, else time-slicing, else None."""
        if self.mps is not None:
            return "mps"
        return "time_slicing" if self.time_slicing is not None else None

    @property
    def replicated(self) -> Replicated | None:
        return self.mps if self.mps is not None else self.time_slicing


# Struct fields of the config (config.go, flags.go): encoding/json matches them case-insensitively and ignores
# every other key. Booleans must be JSON booleans; a number or boolean given for a string is turned into one.
_TOP_FIELDS = {"version": str, "flags": dict, "resources": dict, "sharing": dict, "imex": dict}
_FLAG_FIELDS = {
    "migStrategy": str, "failOnInitError": bool, "mpsRoot": str, "nvidiaDriverRoot": str, "nvidiaDevRoot": str,
    "gdrcopyEnabled": bool, "gdsEnabled": bool, "mofedEnabled": bool, "useNodeFeatureAPI": bool,
    "deviceDiscoveryStrategy": str, "plugin": dict, "gfd": dict,
}  # fmt: skip
_SHARING_FIELDS = {"timeSlicing": dict, "mps": dict}


def _fields(value: Any, fields: Mapping[str, type], where: str, notes: list[str]) -> dict[str, Any]:
    """The struct fields present in a JSON object, by their Go names; type mismatches refused, the rest ignored."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _cannot(value, f"v1.{where or 'Config'}", RULE_PLUGIN_FILE)
    known = {name.lower(): name for name in fields}
    found = {}
    for key, item in value.items():
        name = known.get(key.lower())
        if name is None:
            notes.append(f"{f'{where}.{key}' if where else key}: unknown key, the plugin ignores it")
            continue
        kind = fields[name]
        if item is not None and kind is str and not isinstance(item, str | int | float):
            raise _cannot(item, "string", RULE_PLUGIN_FILE)
        if item is not None and kind is bool and not isinstance(item, bool):
            raise _cannot(item, "bool", RULE_PLUGIN_FILE)
        if item is not None and kind is dict and not isinstance(item, dict):
            raise _cannot(item, f"v1.{name}", RULE_PLUGIN_FILE)
        if kind is str and isinstance(item, bool):
            item = "true" if item else "false"
        elif kind is str and isinstance(item, int | float):
            item = str(item)
        found[name] = item
    return found


def read_device_plugin(text: str) -> PluginConfig:
    """A device-plugin config file as the plugin reads it; raises Rejected where it refuses to start with it."""
    notes: list[str] = []
    top = _fields(load_yaml(text) if text.strip() else None, _TOP_FIELDS, "", notes)
    version = top.get("version") or "v1"
    if version != "v1":
        raise Rejected(f"unknown version: {version}", RULE_PLUGIN_FILE)
    flags = _fields(top.get("flags"), _FLAG_FIELDS, "flags", notes)
    sharing = _fields(top.get("sharing"), _SHARING_FIELDS, "sharing", notes)
    time_slicing = mps = None
    if "timeSlicing" in sharing:  # a struct with its own decoder: even `timeSlicing:` (null) is decoded
        time_slicing = _replicated(sharing["timeSlicing"], "sharing.timeSlicing", notes)
    if sharing.get("mps") is not None:  # a pointer: null leaves it unset
        mps = _replicated(sharing["mps"], "sharing.mps", notes)
    if top.get("resources"):
        notes.append("resources: ignored by the plugin with a warning (DisableResourceNamingInConfig)")
    if top.get("imex"):
        notes.append("imex: used by the plugin, not modelled by Tessera")
    return PluginConfig(flags.get("migStrategy"), time_slicing, mps, tuple(notes))


def _replicated(block: Any, where: str, notes: list[str]) -> Replicated:
    if block is None:
        block = {}
    if not isinstance(block, dict):
        raise _cannot(block, "map[string]json.RawMessage", RULE_REPLICATED)
    rename = block.get("renameByDefault")
    if rename is not None and not isinstance(rename, bool):
        raise _cannot(rename, "bool", RULE_REPLICATED)
    fail = block.get("failRequestsGreaterThanOne")
    if fail is not None and not isinstance(fail, bool):
        raise _cannot(fail, "bool", RULE_REPLICATED)
    resources = block.get("resources")
    if resources is not None and not isinstance(resources, list):
        raise _cannot(resources, "[]v1.ReplicatedResource", RULE_REPLICATED)
    if not resources:
        raise Rejected("no resources specified", RULE_REPLICATED)
    return Replicated(bool(rename), fail, tuple(_resource(item, f"{where}.resources[{i}]", notes)
                                              for i, item in enumerate(resources)))  # fmt: skip


def _resource(item: Any, where: str, notes: list[str]) -> ReplicatedResource:
    if item is None:
        item = {}
    if not isinstance(item, dict):
        raise _cannot(item, "map[string]json.RawMessage", RULE_RESOURCE)
    if "name" not in item:
        raise Rejected("no resource name specified", RULE_RESOURCE)
    name = resource_name(item["name"])
    _check_replicated_devices(item.get("devices", "all"))
    if item.get("devices", "all") != "all":
        notes.append(f"{where}.devices: ignored by the plugin with a warning (DisableResourceNamingInConfig)")
    if "replicas" not in item:
        raise Rejected("no replicas specified", RULE_RESOURCE)
    replicas = 0 if item["replicas"] is None else _json_int(item["replicas"])
    if replicas is None:
        raise _cannot(item["replicas"], "int", RULE_RESOURCE)
    if replicas < 2:
        raise Rejected("number of replicas must be >= 2", RULE_RESOURCE)
    if "rename" in item:
        resource_name(item["rename"])
        notes.append(f"{where}.rename: ignored by the plugin with a warning (DisableResourceNamingInConfig)")
    return ReplicatedResource(name, replicas)


_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def resource_name(value: Any) -> str:
    """A resource name as NewResourceName makes it: nvidia.com/ prefixed, ≤ 63 characters, a DNS subdomain."""
    if value is not None and not isinstance(value, str):
        raise _cannot(value, "string", RULE_RESOURCE_NAME)
    name = value or ""
    if not name.startswith("nvidia.com/"):
        name = "nvidia.com/" + name
    if len(name) > 63:
        raise Rejected(f"fully-qualified resource name must be 63 characters or less: {name}", RULE_RESOURCE_NAME)
    short = name.split("/", 1)[1]
    if len(short) > 253 or _DNS_SUBDOMAIN_RE.match(short) is None:
        raise Rejected(f"incorrect format for resource name '{name}': not a DNS-1123 subdomain", RULE_RESOURCE_NAME)
    return name


_DEVICE_REF_RE = re.compile(
    r"^(?:\d+|\d+:\d+|(?:MIG-)?GPU-[0-9a-fA-F-]{36}|MIG-[0-9a-fA-F-]{36}|MIG-GPU-[0-9a-fA-F-]{36}/\d+/\d+)$"
)


def _check_replicated_devices(devices: Any) -> None:
    """`devices` of a shared resource: "all", a count > 0, or a list of indices or UUIDs (read, then ignored)."""
    if devices is None:
        devices = ""  # null decodes as the empty string
    if isinstance(devices, str):
        if devices != "all":
            raise Rejected(f"devices set as '{devices}' but the only valid string input is 'all'", RULE_DEVICES)
    elif _json_int(devices) is not None:
        if _json_int(devices) <= 0:
            raise Rejected(f"devices set as '{devices}' but a count of devices must be > 0", RULE_DEVICES)
    elif isinstance(devices, list):
        for item in devices:
            if _json_int(item) is not None and item >= 0:
                continue
            if not isinstance(item, str) or _DEVICE_REF_RE.match(item) is None:
                raise Rejected(f"unsupported type for device in devices list: {item}", RULE_DEVICES)
    else:
        raise Rejected(f"unrecognized type for devices spec: {devices}", RULE_DEVICES)


def plugin_start_error(config: PluginConfig, cluster_strategy: str = "") -> Rejected | None:
    """Why the plugin exits at start with this config (validateFlags), given the ClusterPolicy's MIG strategy,
    which the GPU Operator passes as MIG_STRATEGY and which beats flags.migStrategy (contracts §1.2). `--mps-root`
    is the operator's to set, so its absence is not the config's fault."""
    strategy = cluster_strategy or config.mig_strategy or "none"
    if config.sharing == "mps" and strategy == "mixed":
        return Rejected("using --mig-strategy=mixed is not supported with MPS", RULE_START)
    if strategy not in ("none", "single", "mixed"):
        return Rejected(f"unknown MIG strategy: {strategy}", RULE_START)
    return None
