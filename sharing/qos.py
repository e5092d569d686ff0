"""QoS rules as plain values: Kubernetes' pod QoS class, workload-rule checks, and policy consistency checks.

Pure (no Django, no I/O). Pod QoS follows Kubernetes' own ComputePodQOS (pkg/apis/core/helper/qos; nvidia-contracts.md
§7.3): only CPU and memory above zero count, init containers included, a missing request defaults to the limit, and
pod-level resources (spec.resources) replace the containers' when set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sharing.mig import GpuProduct

GUARANTEED, BURSTABLE, BEST_EFFORT = "Guaranteed", "Burstable", "BestEffort"
QOS_RANK = {BEST_EFFORT: 0, BURSTABLE: 1, GUARANTEED: 2}
REQUIRED_QOS = {"any": BEST_EFFORT, "burstable": BURSTABLE, "guaranteed": GUARANTEED}
SHARED_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")

_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def parse_quantity(value) -> Decimal:
    """A Kubernetes resource quantity ("500m", "2Gi", "1e3", 4) as a number, so "1" equals "1000m"."""
    match = _QUANTITY_RE.match(str(value).strip())
    if match is None or match.group(2) not in _SUFFIX:
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except InvalidOperation as exc:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from exc


def _qos_resources(resources: Mapping) -> tuple[dict, dict]:
    """(requests, limits) of cpu and memory above zero: a zero quantity counts as unset, as in Kubernetes. A missing
    request defaults to the limit, as the API server defaults it, so undefaulted specs get the same answer."""
    limits = resources.get("limits") or {}
    requests = {**limits, **(resources.get("requests") or {})}

    def positive(values: Mapping) -> dict:
        return {name: q for name in ("cpu", "memory") if name in values and (q := parse_quantity(values[name])) > 0}

    return positive(requests), positive(limits)


def qos_class(spec: Mapping) -> str:
    """The QoS class Kubernetes gives a pod spec. Pod-level `resources` with any request or limit decide alone;
    otherwise every container and init container counts: Guaranteed when each has cpu and memory limits and the
    summed requests equal the summed limits, BestEffort when none has a cpu or memory request or limit.

    A missing pod-level request is taken from the pod-level limit. The API server takes it from the containers'
    requests when any container sets one (KEP-2837); specs read back from it are defaulted already."""
    pod_level = spec.get("resources") or {}
    if pod_level.get("requests") or pod_level.get("limits"):
        scopes = [pod_level]
    else:
        scopes = [c.get("resources") or {} for c in [*spec.get("containers", []), *spec.get("initContainers", [])]]
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for resources in scopes:
        scope_requests, scope_limits = _qos_resources(resources)
        guaranteed = guaranteed and set(scope_limits) == {"cpu", "memory"}
        for total, values in ((requests, scope_requests), (limits, scope_limits)):
            for name, quantity in values.items():
                total[name] = total.get(name, 0) + quantity
    if not requests and not limits:
        return BEST_EFFORT
    return GUARANTEED if guaranteed and requests == limits else BURSTABLE


@dataclass(frozen=True)
class WorkloadRules:
    """What a policy demands of the pods on its pool's nodes."""

    required_qos: str = "any"  # any | burstable (at least) | guaranteed
    required_priority_class: str = ""
    max_pods_per_gpu: int | None = None
    exclusive_taint: str = ""  # key=value:Effect; pods must tolerate it


@dataclass(frozen=True)
class PodView:
    """The facts about one observed pod that the rules look at."""

    namespace: str
    name: str
    node: str
    spec: Mapping = field(default_factory=dict)
    gpu_resources: Mapping[str, int] = field(default_factory=dict)
    priority_class: str = ""


@dataclass(frozen=True)
class Violation:
    namespace: str
    name: str
    node: str
    rule: str  # qos | priority | max_pods_per_gpu | exclusive
    message: str


def parse_taint(text: str) -> tuple[str, str, str]:
    """`key=value:Effect` (value optional) → (key, value, effect); raises ValueError with the expected form."""
    match = re.match(r"^([A-Za-z0-9./_-]+)(?:=([A-Za-z0-9._-]*))?:(NoSchedule|PreferNoSchedule|NoExecute)$", text)
    if match is None:
        raise ValueError(f"{text!r} is not a taint; write key=value:NoSchedule (or PreferNoSchedule, NoExecute)")
    return match.group(1), match.group(2) or "", match.group(3)


def tolerates(tolerations: Sequence[Mapping], taint: tuple[str, str, str]) -> bool:
    """Kubernetes' toleration matching: Exists matches any value; an empty key with Exists matches every taint."""
    key, value, effect = taint
    for toleration in tolerations or ():
        if toleration.get("effect") and toleration["effect"] != effect:
            continue
        operator = toleration.get("operator", "Equal")
        if operator == "Exists" and toleration.get("key", "") in ("", key):
            return True
        if operator == "Equal" and toleration.get("key") == key and toleration.get("value", "") == value:
            return True
    return False


def check_pods(rules: WorkloadRules, pods: Sequence[PodView], gpus_per_node: Mapping[str, int]) -> list[Violation]:
    """Every rule each pod breaks; `gpus_per_node` counts physical GPUs for the per-GPU pod cap."""
    violations = []
    required = REQUIRED_QOS[rules.required_qos]
    taint = parse_taint(rules.exclusive_taint) if rules.exclusive_taint else None
    for pod in pods:
        where = (pod.namespace, pod.name, pod.node)
        actual = qos_class(pod.spec)
        if QOS_RANK[actual] < QOS_RANK[required]:
            violations.append(Violation(*where, "qos", f"QoS class {actual}; the pool requires {required}"))
        priority = pod.priority_class or pod.spec.get("priorityClassName", "")
        if rules.required_priority_class and priority != rules.required_priority_class:
            got = priority or "none"
            violations.append(
                Violation(*where, "priority", f"priority class {got}; required {rules.required_priority_class}")
            )
        if taint and not tolerates(pod.spec.get("tolerations", []), taint):
            violations.append(
                Violation(*where, "exclusive", f"does not tolerate the pool's taint {rules.exclusive_taint}")
            )
    if rules.max_pods_per_gpu:
        violations.extend(_oversubscribed(rules.max_pods_per_gpu, pods, gpus_per_node))
    return violations


def _oversubscribed(cap: int, pods: Sequence[PodView], gpus_per_node: Mapping[str, int]) -> list[Violation]:
    """Pods beyond `cap` per physical GPU on a node sharing whole GPUs (time-slicing or MPS replicas)."""
    by_node: dict[str, list[PodView]] = {}
    for pod in pods:
        if any(pod.gpu_resources.get(name) for name in SHARED_GPU_RESOURCES):
            by_node.setdefault(pod.node, []).append(pod)
    violations = []
    for node, sharing in by_node.items():
        allowed = cap * gpus_per_node.get(node, 0)
        for pod in sorted(sharing, key=lambda p: (p.namespace, p.name))[allowed:]:
            violations.append(
                Violation(
                    pod.namespace,
                    pod.name,
                    node,
                    "max_pods_per_gpu",
                    f"{len(sharing)} pods share {gpus_per_node.get(node, 0)} GPUs; at most {cap} per GPU",
                )
            )
    return violations


@dataclass(frozen=True)
class PolicySpec:
    """The parts of a QoS policy the consistency checks read."""

    requires_memory_isolation: bool = False
    mps_active_thread_percentage: int | None = None
    mps_pinned_memory_limit_mib: int | None = None
    time_slice_interval: str = ""
    required_qos: str = "any"


def consistency_errors(policy: PolicySpec, sharing_mode: str) -> dict[str, list[str]]:
    """Why this policy contradicts the sharing mode it would run with, per field (checked before anything applies)."""
    errors: dict[str, list[str]] = {}
    if policy.requires_memory_isolation and sharing_mode in ("time_slicing", "mps"):
        what = "time-slicing" if sharing_mode == "time_slicing" else "MPS"
        errors["requires_memory_isolation"] = [f"{what} gives no memory isolation; use MIG or whole GPUs."]
    if sharing_mode != "mps":
        for name in ("mps_active_thread_percentage", "mps_pinned_memory_limit_mib"):
            if getattr(policy, name) is not None:
                errors[name] = [
                    f"MPS limits have no effect: the profile shares GPUs by {sharing_mode.replace('_', '-')}."
                ]
    if policy.time_slice_interval and sharing_mode == "mig":
        errors["time_slice_interval"] = ["The time-slice length applies to whole GPUs, not MIG devices."]
    return errors


# GPU settings whose valid values depend on the board (nvidia-contracts.md §4.3): the policy field, its words, the
# unit, and the product's (low, high) range and whether that range is an estimate.
_BOARD_RANGES = (
    ("power_limit_w", "Power limit", "W", lambda p: (p.power_limit_w, p.power_limit_estimated)),
    ("gpu_clock_min_mhz", "Locked GPU clock min", "MHz", lambda p: (p.graphics_clock_mhz, p.graphics_clock_estimated)),
    ("gpu_clock_max_mhz", "Locked GPU clock max", "MHz", lambda p: (p.graphics_clock_mhz, p.graphics_clock_estimated)),
    ("mps_pinned_memory_limit_mib", "MPS pinned memory limit", "MiB", lambda p: ((0, p.memory_mib), False)),
)

BOARD_RANGE_FIELDS = tuple(name for name, *_ in _BOARD_RANGES)


def board_range_errors(settings: Mapping[str, int | None], boards: Sequence[tuple[GpuProduct, str]]) -> dict:
    """Per policy field, why a GPU setting is outside what a board accepts: `boards` are (catalog product, where it
    is, e.g. "pool gpu-a"), and each message names the value, the range, the product and the place."""
    errors: dict[str, list[str]] = {}
    for field_name, label, unit, range_of in _BOARD_RANGES:
        value = settings.get(field_name)
        if value is None:
            continue
        for product, where in boards:
            bounds, estimated = range_of(product)
            if bounds is None or bounds[0] <= value <= bounds[1]:
                continue
            note = " (an estimated range)" if estimated else ""
            name = product.display_name.removeprefix("NVIDIA ")
            errors.setdefault(field_name, []).append(
                f"{label} {value} {unit} is outside {bounds[0]}–{bounds[1]} {unit} for {name} ({where}){note}."
            )
    return errors


def flagged_share(rules: WorkloadRules, pods: Sequence[PodView], gpus_per_node: Mapping[str, int]) -> tuple[int, int]:
    """(pods the rules would flag, pods observed): shown before a policy is attached."""
    flagged = {(v.namespace, v.name) for v in check_pods(rules, pods, gpus_per_node)}
    return len(flagged), len(pods)


# --- QoS node settings: desired against what the node reported ------------------------------------------------------

MATCHES, DIFFERS, NOT_REPORTED = "matches", "differs", "not_reported"
# The agent reads host tuning under the QoSPolicy.node_settings() keys (Node.host_settings), but for this one.
HOST_READINGS = {"transparent_hugepages": "thp"}
# The GPU settings NVML reads back (Gpu.settings, same keys). The others (locked clocks, time slice, MPS daemon
# defaults) it cannot: the agent's record of what it applied (Node.agent_node_settings) is all there is to compare.
GPU_READABLE = frozenset({"persistence_mode", "compute_mode", "power_limit_w"})


@dataclass(frozen=True)
class SettingCheck:
    """One desired node setting beside what the node runs; GPU settings counted over the node's GPUs."""

    section: str  # gpu | host
    name: str  # the key in QoSPolicy.node_settings()
    desired: object
    status: str  # matches | differs | not_reported
    observed: tuple[tuple[object, int], ...] = ()  # (value, on how many GPUs; 1 for the host), most common first
    gpus: int = 0  # GPUs compared
    gpus_differ: int = 0
    gpus_unreported: int = 0
    agent_record: bool = False  # compared with what the agent says it set: NVML cannot read this setting back


@dataclass(frozen=True)
class SettingsComparison:
    """Every desired node setting of a node against its report; `reported` is False until its agent reported any."""

    checks: tuple[SettingCheck, ...]
    reported: bool

    @property
    def differing(self) -> int:
        return sum(c.status == DIFFERS for c in self.checks)

    @property
    def unreported(self) -> int:
        return sum(c.status == NOT_REPORTED for c in self.checks)

    @property
    def status(self) -> str:
        """awaiting (nothing reported yet) | differs | not_reported (none differs, some cannot be seen) | matches"""
        if not self.reported:
            return "awaiting"
        if self.differing:
            return DIFFERS
        return NOT_REPORTED if self.unreported else MATCHES


def _same(desired: object, observed: object) -> bool:
    # 250 W asked, 250.0 W read: numbers compare as numbers; a bool is never a number here.
    if isinstance(desired, bool) or isinstance(observed, bool):
        return desired is observed
    return desired == observed


def _gpu_check(name: str, desired: object, readings: Sequence[object | None]) -> SettingCheck:
    counts: dict = {}
    differ = unreported = 0
    for value in readings:
        if value is None:
            unreported += 1
            continue
        key = (type(value) is bool, value)  # True and 1 are different readings
        counts[key] = counts.get(key, 0) + 1
        differ += not _same(desired, value)
    if differ:
        status = DIFFERS
    elif unreported or not readings:
        status = NOT_REPORTED
    else:
        status = MATCHES
    observed = tuple((value, n) for (_, value), n in sorted(counts.items(), key=lambda item: -item[1]))
    return SettingCheck(
        "gpu", name, desired, status, observed, gpus=len(readings), gpus_differ=differ, gpus_unreported=unreported
    )


def compare_node_settings(
    desired: Mapping,
    *,
    host: Mapping | None,
    gpus: Sequence[Mapping | None],
    agent_record: Mapping | None,
) -> SettingsComparison:
    """Desired node settings (`QoSPolicy.node_settings()`) against the node's report: `host` its host tuning as read,
    `gpus` each live GPU's settings as read (None: never reported), `agent_record` the node settings its agent last
    applied (`{gpu, host}` as desired; the only source for what NVML cannot read back). A reading of None is not
    reported (an older agent, or unreadable on that node)."""
    checks = []
    recorded = (agent_record or {}).get("gpu") or {}
    for name, value in (desired.get("gpu") or {}).items():
        if name in GPU_READABLE:
            checks.append(_gpu_check(name, value, [(g or {}).get(name) for g in gpus]))
        elif agent_record is None:
            checks.append(SettingCheck("gpu", name, value, NOT_REPORTED, gpus=len(gpus), agent_record=True))
        else:
            # Absent from the record: the agent applied a config that leaves this setting as the GPU has it.
            got = recorded.get(name)
            status = MATCHES if got is not None and _same(value, got) else DIFFERS
            observed = ((got, len(gpus)),) if got is not None else ()
            checks.append(SettingCheck("gpu", name, value, status, observed, gpus=len(gpus), agent_record=True))
    for name, value in (desired.get("host") or {}).items():
        got = (host or {}).get(HOST_READINGS.get(name, name))
        if got is None:
            checks.append(SettingCheck("host", name, value, NOT_REPORTED))
        else:
            checks.append(SettingCheck("host", name, value, MATCHES if _same(value, got) else DIFFERS, ((got, 1),)))
    reported = host is not None or any(g is not None for g in gpus)
    return SettingsComparison(tuple(checks), reported)
