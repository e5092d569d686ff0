"""The NVIDIA config files Tessera writes, rendered and parsed as the real tools read them.

mig-parted config: nvidia-contracts.md §2.1. Device-plugin config: §3.1, selected per node by key (§3.4).
Pure: plain frozen dataclasses in, text out, and back. Reading goes through sharing.nvidia_configs, which accepts
and refuses what mig-parted and the device plugin accept and refuse.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from sharing.mig.catalog import profile_name_key
from sharing.nvidia_configs import (
    check_device_filter,
    check_devices,
    check_mig_devices,
    load_yaml,
    read_device_plugin,
    read_mig_parted,
)

_LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_CONTENT_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_MIG_RESOURCE_RE = re.compile(r"^nvidia\.com/mig-(?:\d+c\.)?\d+g\.\d+gb(?:\.me\.all|\.me|\.gfx|-me)?$")
GPU_RESOURCE = "nvidia.com/gpu"
MPS_MAX_REPLICAS = 48  # §3.3: 48 per GPU from compute capability 7.5, 16 before (checked where the GPU is known)


# ---------------------------------------------------------------------------------------------------------------
# mig-parted
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MigDeviceSpec:
    """One entry of a named mig-parted config: which GPUs, MIG on or off, which devices to create (§2.1)."""

    devices: Literal["all"] | tuple[int, ...]
    mig_enabled: bool
    mig_devices: Mapping[str, int] = field(default_factory=dict)
    device_filter: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # mig-parted's own rules (sharing.nvidia_configs): `devices: []` and filters naming no GPU are accepted.
        # Indices are sorted (the order means nothing to mig-parted) so the same entry always renders the same.
        devices = check_devices(list(self.devices) if self.devices != "all" else "all")
        object.__setattr__(self, "devices", devices if devices == "all" else tuple(sorted(devices)))
        if not isinstance(self.mig_enabled, bool):
            raise ValueError(f"mig-enabled must be true or false, not {self.mig_enabled!r}")
        devices = check_mig_devices(self.mig_enabled, self.mig_devices)
        object.__setattr__(self, "mig_devices", {name: devices[name] for name in sorted(devices, key=profile_name_key)})
        object.__setattr__(self, "device_filter", check_device_filter(self.device_filter))


@functools.lru_cache(maxsize=1024)  # two YAML parses a name; a 500-node preview renders the same few names
def _yaml_key(name: str) -> str:
    # A name YAML would read as something else (true, 123, 0x1F, null; and y/n, booleans to go-yaml v2, which
    # mig-parted reads with) is quoted; label-value characters need no escaping inside double quotes.
    line = f"{name}: 0"
    return name if yaml.safe_load(line) == {name: 0} and load_yaml(line) == {name: 0} else f'"{name}"'


def render_mig_parted_config(configs: Mapping[str, Sequence[MigDeviceSpec]]) -> str:
    """Write the mig-parted config MIG Manager applies; the same configs always give the same bytes (§2.1)."""
    if not configs:
        raise ValueError("a mig-parted config needs at least one named config")
    lines = ["version: v1", "mig-configs:"]
    for name in sorted(configs, key=str):
        # The name is selected with the node label nvidia.com/mig.config, so it must be a label value (§1.1).
        if not isinstance(name, str) or len(name) > 63 or _LABEL_VALUE_RE.match(name) is None:
            raise ValueError(f"config name {name!r} is not a Kubernetes label value (≤ 63 of A-Z a-z 0-9 - _ .)")
        if not configs[name]:
            raise ValueError(f"config {name} needs at least one device entry")
        lines.append(f"  {_yaml_key(name)}:")
        for spec in configs[name]:
            devices = "all" if spec.devices == "all" else "[" + ", ".join(map(str, spec.devices)) + "]"
            lines.append(f"    - devices: {devices}")
            if spec.device_filter:
                lines.append("      device-filter: [" + ", ".join(json.dumps(pci) for pci in spec.device_filter) + "]")
            lines.append(f"      mig-enabled: {'true' if spec.mig_enabled else 'false'}")
            if spec.mig_enabled and not spec.mig_devices:
                lines.append("      mig-devices: {}")
            elif spec.mig_enabled:
                lines.append("      mig-devices:")
                lines.extend(f'        "{profile}": {count}' for profile, count in spec.mig_devices.items())
    return "\n".join(lines) + "\n"


def parse_mig_parted_config(text: str) -> dict[str, list[MigDeviceSpec]]:
    """Read a mig-parted config as mig-parted does, so the simulator and the agent fail where a node would; the
    ValueError (nvidia_configs.Rejected) gives mig-parted's reason."""
    return {
        name: [MigDeviceSpec(e["devices"], e["mig_enabled"], e["mig_devices"], e["device_filter"]) for e in entries]
        for name, entries in read_mig_parted(text).items()
    }


# ---------------------------------------------------------------------------------------------------------------
# k8s-device-plugin
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePluginSpec:
    """What the device plugin advertises on a node: MIG strategy and one sharing method for all GPUs (§3.1, §3.2)."""

    mig_strategy: Literal["none", "single", "mixed"] = "none"
    sharing: Literal["time_slicing", "mps"] | None = None
    replicas: int = 1
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool | None = None
    resources: tuple[str, ...] = (GPU_RESOURCE,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", tuple(self.resources))
        if self.mig_strategy not in ("none", "single", "mixed"):
            raise ValueError(f"migStrategy must be none, single or mixed, not {self.mig_strategy!r}")
        if self.sharing is None:
            if (self.replicas, self.rename_by_default, self.fail_requests_greater_than_one) != (1, False, None) or (
                self.resources != (GPU_RESOURCE,)
            ):
                raise ValueError("replicas, renaming, failRequestsGreaterThanOne and resources need a sharing method")
            return
        if self.sharing not in ("time_slicing", "mps"):
            raise ValueError(f"sharing must be time_slicing, mps or None, not {self.sharing!r}")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 2:
            raise ValueError(f"sharing needs replicas ≥ 2, not {self.replicas!r}")  # §3.1
        fail = self.fail_requests_greater_than_one
        if not isinstance(self.rename_by_default, bool) or not (fail is None or isinstance(fail, bool)):
            raise ValueError("renameByDefault and failRequestsGreaterThanOne must be true or false")
        if not self.resources or len(set(self.resources)) != len(self.resources):
            raise ValueError(f"sharing needs a list of distinct resources, not {list(self.resources)}")
        for resource in self.resources:
            if resource != GPU_RESOURCE and _MIG_RESOURCE_RE.match(resource) is None:
                raise ValueError(f"{resource!r} is not nvidia.com/gpu or a nvidia.com/mig-<profile> resource")
            if resource != GPU_RESOURCE and self.mig_strategy != "mixed":
                raise ValueError(f"{resource} exists only under migStrategy mixed (§3.5)")
        if self.sharing == "mps":
            # §3.3: the plugin rejects MPS with migStrategy mixed and does not share MIG devices with MPS.
            if self.mig_strategy == "mixed" or self.resources != (GPU_RESOURCE,):
                raise ValueError("MPS cannot be combined with MIG: no migStrategy mixed, only nvidia.com/gpu")
            if self.replicas > MPS_MAX_REPLICAS:
                raise ValueError(f"MPS allows at most {MPS_MAX_REPLICAS} replicas per GPU, not {self.replicas}")


def render_device_plugin_config(spec: DevicePluginSpec) -> str:
    """Write one device-plugin config (a key of its ConfigMap); the same spec always gives the same bytes (§3.1)."""
    lines = ["version: v1", "flags:", f"  migStrategy: {spec.mig_strategy}"]
    # No flags.mpsRoot for MPS: the GPU Operator sets it on the plugin itself (§3.1).
    if spec.sharing is not None:
        lines += ["sharing:", "  timeSlicing:" if spec.sharing == "time_slicing" else "  mps:"]
        lines.append(f"    renameByDefault: {'true' if spec.rename_by_default else 'false'}")
        if spec.fail_requests_greater_than_one is not None:
            lines.append(
                f"    failRequestsGreaterThanOne: {'true' if spec.fail_requests_greater_than_one else 'false'}"
            )
        lines.append("    resources:")
        for resource in spec.resources:
            lines += [f"      - name: {resource}", f"        replicas: {spec.replicas}"]
    return "\n".join(lines) + "\n"


def parse_device_plugin_config(text: str) -> DevicePluginSpec:
    """Read one device-plugin config as the plugin does, into what Tessera models; an empty config means the
    defaults. ValueError for what the plugin refuses (nvidia_configs.Rejected, its reason) and for what Tessera
    cannot model: replicas that differ per resource, resources other than nvidia.com/gpu and nvidia.com/mig-*."""
    config = read_device_plugin(text)
    block = config.replicated
    try:
        if block is None:
            return DevicePluginSpec(mig_strategy=config.mig_strategy or "none")
        replicas = sorted({resource.replicas for resource in block.resources})
        if len(replicas) > 1:
            raise ValueError(f"Tessera shares every resource with the same replicas, got {replicas}")
        return DevicePluginSpec(
            mig_strategy=config.mig_strategy or "none",
            sharing=config.sharing,
            replicas=replicas[0],
            rename_by_default=block.rename_by_default,
            fail_requests_greater_than_one=block.fail_requests_greater_than_one,
            resources=tuple(resource.name for resource in block.resources),
        )
    except ValueError as error:
        raise ValueError(f"device-plugin config: {error}") from None


# ---------------------------------------------------------------------------------------------------------------
# shared
# ---------------------------------------------------------------------------------------------------------------


def content_name(prefix: str, text: str) -> str:
    """Name a config after its content, so new content always gets a key no node has seen yet (§3.4)."""
    canonical = text.replace("\r\n", "\n").rstrip("\n") + "\n"
    name = prefix + hashlib.sha256(canonical.encode()).hexdigest()[:10]
    if len(name) > 63 or _CONTENT_NAME_RE.match(name) is None:
        raise ValueError(f"{name!r} is not a valid label value; use a short prefix of a-z 0-9 - .")
    return name


# ---------------------------------------------------------------------------------------------------------------
# ValidatingAdmissionPolicy: a QoS policy's pod rules enforced by the API server (admissionregistration.k8s.io/v1)
# ---------------------------------------------------------------------------------------------------------------

ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
ADMISSION_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")  # and every nvidia.com/mig-* (§3.5)
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_REQUIRED_QOS = ("any", "burstable", "guaranteed")

# CEL over the pod being created. Every container and init container counts, as in the pod's QoS class (§7.3).
_CEL_CONTAINERS = "object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
_CEL_REQUESTS_GPU = (
    "variables.containers.exists(c, has(c.resources) && has(c.resources.limits) && c.resources.limits.exists(r, "
    + " || ".join(f"r == '{name}'" for name in ADMISSION_GPU_RESOURCES)
    + " || r.startsWith('nvidia.com/mig-')))"
)


# The pod's QoS class as Kubernetes computes it (sharing.qos.qos_class): only cpu and memory above zero count (a "0"
# counts as unset), and pod-level spec.resources with any request or limit decide alone. Quantities are compared as
# quantities ("1" == "1000m"); string() because the schema types them int-or-string. A missing request counts as the
# limit: the API server has defaulted it before admission, but the rule should not depend on that.
def _cel_above_zero(quantity: str) -> str:
    return f"quantity(string({quantity})).isGreaterThan(quantity('0'))"


def _cel_guaranteed(res: str) -> str:
    """CEL: the ResourceRequirements `res` has cpu and memory limits above zero, and requests equal to them."""
    return (
        f"has({res}) && has({res}.limits) && ['cpu', 'memory'].all(r, r in {res}.limits && "
        f"{_cel_above_zero(f'{res}.limits[r]')} && (!has({res}.requests) || !(r in {res}.requests) || "
        f"quantity(string({res}.requests[r])).compareTo(quantity(string({res}.limits[r]))) == 0))"
    )


def _cel_sets_cpu_or_memory(res: str) -> str:
    """CEL: the ResourceRequirements `res` has a cpu or memory request or limit above zero."""
    return (
        f"has({res}) && ['cpu', 'memory'].exists(r, "
        f"(has({res}.requests) && r in {res}.requests && {_cel_above_zero(f'{res}.requests[r]')}) || "
        f"(has({res}.limits) && r in {res}.limits && {_cel_above_zero(f'{res}.limits[r]')}))"
    )


_CEL_POD_LEVEL = (
    "has(object.spec.resources) && ("
    "(has(object.spec.resources.requests) && size(object.spec.resources.requests) > 0) || "
    "(has(object.spec.resources.limits) && size(object.spec.resources.limits) > 0))"
)
# Kubernetes compares the containers' summed requests with their summed limits. Validation has already made each
# request at most its limit, so the sums are equal exactly when every container's are: checked per container.
_CEL_GUARANTEED = (
    f"(({_CEL_POD_LEVEL}) ? {_cel_guaranteed('object.spec.resources')} : "
    f"variables.containers.all(c, {_cel_guaranteed('c.resources')}))"
)
_CEL_NOT_BEST_EFFORT = (
    f"(({_CEL_POD_LEVEL}) ? {_cel_sets_cpu_or_memory('object.spec.resources')} : "
    f"variables.containers.exists(c, {_cel_sets_cpu_or_memory('c.resources')}))"
)


def _pool_match(node_pool_label: str) -> tuple[str, str]:
    """The CEL that says a pod asks for the pool's nodes, and the pool's description for messages."""
    key, equals, value = node_pool_label.partition("=")
    key, value = key.strip(), value.strip()
    if "," in node_pool_label or not _LABEL_KEY_RE.match(key) or (equals and not _LABEL_VALUE_RE.match(value)):
        expected = "one label, key=value or key (as tessera.io/pool=inference)"
        raise ValueError(f"node_pool_label must be {expected}, not {node_pool_label!r}")
    terms = (
        "has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
        "has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) && "
        "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    )
    selector = f"has(object.spec.nodeSelector) && '{key}' in object.spec.nodeSelector"
    if equals:
        selector += f" && object.spec.nodeSelector['{key}'] == '{value}'"
        expression = f"e.key == '{key}' && e.operator == 'In' && has(e.values) && '{value}' in e.values"
    else:
        expression = f"e.key == '{key}' && (e.operator == 'In' || e.operator == 'Exists')"
    cel = f"({selector}) || ({terms}.exists(t, has(t.matchExpressions) && t.matchExpressions.exists(e, {expression})))"
    return cel, f"{key}={value}" if equals else key


def _check_admission_arguments(
    name: str, required_qos: str, required_priority_class: str, namespace_selector: Mapping[str, Any] | None
) -> None:
    """ValueError for an object name, QoS class, priority class or namespace selector Kubernetes would refuse."""
    if not isinstance(name, str) or _DNS_SUBDOMAIN_RE.match(name) is None:
        raise ValueError(f"{name!r} is not a Kubernetes object name (a DNS subdomain: a-z 0-9 - .)")
    if required_qos not in _REQUIRED_QOS:
        raise ValueError(f"required_qos must be one of {', '.join(_REQUIRED_QOS)}, not {required_qos!r}")
    if required_priority_class and _DNS_SUBDOMAIN_RE.match(required_priority_class) is None:
        raise ValueError(f"{required_priority_class!r} is not a PriorityClass name")
    if required_qos == "any" and not required_priority_class:
        raise ValueError("nothing to enforce: the policy requires neither a QoS class nor a priority class")
    selector_keys = {"matchLabels", "matchExpressions"}
    if namespace_selector is not None and (
        not isinstance(namespace_selector, Mapping) or not set(namespace_selector) <= selector_keys
    ):
        raise ValueError("namespace_selector must be a label selector: {matchLabels: ..., matchExpressions: [...]}")


def _admission_variables(node_pool_label: str | None) -> tuple[list[dict], str, str]:
    """The policy's CEL variables, the condition that exempts a pod from its rules, and who the rules are for."""
    variables = [
        {"name": "containers", "expression": _CEL_CONTAINERS},
        {"name": "requestsGpu", "expression": _CEL_REQUESTS_GPU},
    ]
    applies, who = "!variables.requestsGpu", "pods that request NVIDIA GPUs"
    if node_pool_label:
        pool_cel, pool = _pool_match(node_pool_label)
        variables.append({"name": "inPool", "expression": pool_cel})
        applies, who = "!variables.requestsGpu || !variables.inPool", f"{who} on nodes selected by {pool}"
    return variables, applies, who


def _admission_validations(
    prefix: str, required_qos: str, required_priority_class: str, *, applies: str, who: str
) -> list[dict]:
    """One validation per rule the policy enforces (QoS class, priority class); pods it does not apply to pass."""
    validations = []
    if required_qos == "guaranteed":
        validations.append(
            {
                "expression": f"{applies} || {_CEL_GUARANTEED}",
                "message": f"{prefix} (rule qos): {who} must be Guaranteed: every container and init container "
                "(or the pod's spec.resources, when set) needs cpu and memory limits above zero, with requests equal "
                "to the limits.",
                "reason": "Forbidden",
            }
        )
    elif required_qos == "burstable":
        validations.append(
            {
                "expression": f"{applies} || {_CEL_NOT_BEST_EFFORT}",
                "message": f"{prefix} (rule qos): {who} must be Burstable or Guaranteed: at least one container "
                "(or the pod's spec.resources, when set) needs a cpu or memory request or limit above zero.",
                "reason": "Forbidden",
            }
        )
    if required_priority_class:
        validations.append(
            {
                "expression": f"{applies} || (has(object.spec.priorityClassName) && "
                f"object.spec.priorityClassName == '{required_priority_class}')",
                "message": f"{prefix} (rule priority): {who} must use priority class {required_priority_class}.",
                "reason": "Forbidden",
            }
        )
    return validations


def render_admission_policy(
    name: str,
    *,
    required_qos: str,
    required_priority_class: str,
    namespace_selector: Mapping[str, Any] | None = None,
    node_pool_label: str | None = None,
) -> tuple[dict, dict]:
    """A ValidatingAdmissionPolicy and its binding (Kubernetes ≥ 1.30) that deny creating a pod which requests
    NVIDIA GPUs (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-* in any container's limits) and breaks a QoS
    policy's workload rules: not Guaranteed when `required_qos` is "guaranteed", BestEffort when "burstable", or not
    the `required_priority_class`. The QoS class is Kubernetes' own (sharing.qos.qos_class, which the tests hold the
    CEL to): only cpu and memory above zero count; pod-level `spec.resources` with any request or limit decide alone
    (Kubernetes 1.32+, on by default from 1.34), otherwise every container and init container counts.

    What admission can and cannot see, so compliance reports (sharing.qos.check_pods) stay the safety net:
    - It sees a pod at CREATE, before scheduling: which pool a pod lands in is unknown. With `node_pool_label`
      ("key=value", or "key" for any value) only pods that ask for the pool are checked: `spec.nodeSelector[key]`
      equal to the value, or a required node-affinity term `key In [value]` (any of the ORed terms, so a pod that
      may land there counts). A pod reaching the pool otherwise (no selector, `spec.nodeName` set, other affinity
      operators) is not checked: pair the policy with the pool's exclusive taint. Without it, every pod that requests
      GPUs in the bound namespaces is checked.
    - The object is the defaulted one: requests already copied from limits, and the Priority admission plugin has
      filled in a globalDefault PriorityClass.
    - Controllers' pods are denied at pod creation: a Deployment or Job is accepted and its pods fail (FailedCreate
      events on the ReplicaSet or Job). UPDATE is not matched: QoS class and priority cannot change after creation.
      Ephemeral containers (added through a subresource) are not checked.
    - `quantity()` is Kubernetes' CEL quantity library (1.28+); v1 of the API needs 1.30.
    """
    _check_admission_arguments(name, required_qos, required_priority_class, namespace_selector)
    variables, applies, who = _admission_variables(node_pool_label)
    validations = _admission_validations(
        f"Tessera QoS policy {name}", required_qos, required_priority_class, applies=applies, who=who
    )
    labels = {"app.kubernetes.io/managed-by": "tessera"}
    policy = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ]
            },
            "variables": variables,
            "validations": validations,
        },
    }
    binding_spec: dict[str, Any] = {"policyName": name, "validationActions": ["Deny"]}
    if namespace_selector is not None:
        binding_spec["matchResources"] = {"namespaceSelector": dict(namespace_selector)}
    binding = {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": binding_spec,
    }
    return policy, binding


def render_admission_manifests(policy: Mapping[str, Any], binding: Mapping[str, Any]) -> str:
    """Both objects as one YAML stream for `kubectl apply -f -`; the same input always gives the same bytes."""
    return yaml.safe_dump_all([policy, binding], sort_keys=False, width=1000, default_flow_style=False)
