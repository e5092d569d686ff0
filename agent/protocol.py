"""The wire contract between the node agent and the Tessera server: the server implements exactly this.

All bodies are JSON objects; every message below has `to_dict()` (plain JSON types) and `from_dict()`. Unknown keys
are ignored on reading, so either side may add fields before the other knows them; a missing required key or a value
of the wrong type raises `ProtocolError` naming the field.

Endpoints (under the server's base URL):

- `POST /api/v1/agent/register/` — body `RegisterRequest` {join_token, hostname, agent_version, credential?,
  service_account_token?, request_key?}, no Authorization header. → 201 `RegisterResponse` {node_id, node_name,
  credential, interval_seconds}. A node registers once: the join token (of one cluster; possibly single-use, bound
  to a node-name pattern, or to a Kubernetes service account) is traded for a per-node credential that can only
  read and report for its own node. A hostname the server has already is registered again (same node, new
  credential, the old one revoked) only with that node's current `credential`, a `service_account_token` the
  cluster's API server vouches for on that node (join tokens with a service account always need one), or an
  admin's approval: → 202 `RegisterPending` {node_name, fingerprint, message} while it waits; the agent asks again
  with the same `request_key` until 201 (approved) or 403 (rejected). The credential is sent as
  `Authorization: Bearer <credential>` on every call below. 401/403 here: the join token is wrong, expired,
  revoked, or does not allow this node.
- `POST /api/v1/agent/report/` — body `Report`: inventory and metrics of every GPU, host settings, the config the
  node runs (`applied`) and the XID events seen since the last successful report. → 200 `ReportResponse`
  {desired_config_id}: null when the server has nothing for the node; when it differs from `applied.config_id` the
  agent fetches the desired config. `inventory_digest` is `inventory_digest(report)` of this module: when it is the
  digest of the node's inventory the server recorded last, the server reads only the report's metrics (`GpuMetrics`
  of each GPU) and the XID events, so an agent must send the digest of exactly what it reports (or none).
- `GET /api/v1/agent/desired/` → 200 `DesiredConfig`. `config_id` is content-addressed (new content, new id);
  `change_id` is the server's NodeChange, or null outside a rollout. `node_settings` is the QoS policy's
  `QoSPolicy.node_settings()` verbatim, `{"gpu": {...}, "host": {...}}` with only the fields the policy sets, or
  null/absent when no policy applies; a change of node settings alone is a new config like any other.
- `POST /api/v1/agent/outcome/` — body `Outcome` {change_id, config_id, status, message, report} → 200.
  `status` is `succeeded`, `failed`, or `refused_busy` (compute processes held GPUs the change touches and the
  safety policy said `wait`; the server decides when to retry or drain). The agent tries each (config_id, change_id)
  once and re-sends an outcome until it is accepted, so the server must accept a repeated outcome; to retry, the
  server issues a new change_id. The outcome's report is a fresh snapshot after the apply; its `xid_events` is
  always empty (XID events travel with `/report/` only, so each is delivered once).
- Errors: 401/403 (and any 4xx) bodies use the server's error shape `ErrorBody` {message, errors}. A 401/403 on
  `/report/` means the credential was revoked or is wrong: the agent prints the message and exits with code 3.

Units: memory in MiB, power in W, temperature in °C, utilisation in %, times as ISO 8601 UTC strings ("…Z").

Bounds: every number carries a `Range` (its type hint is `Annotated`) of what it can mean on a node and what the
server's column holds, every string a `Text`: a length and no control or format characters (the rule of names
people give in Tessera, core/fields.py; free text may have line breaks and tabs). A value outside is a
`ProtocolError` naming the field, on either side (docs/security.md, "Bounds on agent input").
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types
import typing
import unicodedata
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal, Self

API_PREFIX = "/api/v1/agent/"
REGISTER_PATH = API_PREFIX + "register/"
REPORT_PATH = API_PREFIX + "report/"
DESIRED_PATH = API_PREFIX + "desired/"
OUTCOME_PATH = API_PREFIX + "outcome/"

ComputeMode = Literal["default", "exclusive_thread", "prohibited", "exclusive_process"]  # contracts §5
PolicyComputeMode = Literal["default", "exclusive_process", "prohibited"]  # what a QoS policy may ask for
TimeSliceInterval = Literal["default", "short", "medium", "long"]  # contracts §5
TransparentHugePages = Literal["always", "madvise", "never"]
BusyPolicy = Literal["wait", "force"]
OutcomeStatus = Literal["succeeded", "failed", "refused_busy"]


class ProtocolError(ValueError):
    """A message that does not follow this contract; the text names the field."""


@dataclass(frozen=True)
class Range:
    """The bounds of a number field, both included: checked before the value is converted or stored, so that no
    number reaches a database column that cannot hold it (an int past 64 bits, a NaN, 1e308 W)."""

    low: int | float
    high: int | float

    def holds(self, value: int | float) -> bool:
        return self.low <= value <= self.high  # False for NaN

    def problem(self, value: object) -> str | None:
        """What is wrong with a value of the right type; None when it holds (other types: the type check says)."""
        if isinstance(value, int | float) and not isinstance(value, bool) and not self.holds(value):
            return f"must be from {self.low} to {self.high}, not {_shown(value)}"
        return None


# Control (Cc), format (Cf: bidi overrides, zero-width) and line/paragraph separators: what core/fields.py's
# validate_name refuses in the names people give (a test holds the two equal; the agent cannot import Django's side).
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
LINE_CHARACTERS = frozenset("\n\r\t")  # what free text (`Text(lines=True)`) may have besides


@dataclass(frozen=True)
class Text:
    """The bounds of a string field: at most `max_length` characters, none of them a control or format character
    (line breaks and tabs too, unless `lines`: free text such as a message)."""

    max_length: int
    lines: bool = False

    def holds(self, value: str) -> bool:
        # isprintable() is False for every refused category (and a few more): the common case in C.
        return len(value) <= self.max_length and (value.isprintable() or self._refused(value) is None)

    def problem(self, value: object) -> str | None:
        """What is wrong with a string; never the string itself (it may be a secret)."""
        if not isinstance(value, str):
            return None
        if len(value) > self.max_length:
            return f"must be at most {self.max_length} characters, not {len(value)}"
        refused = None if value.isprintable() else self._refused(value)
        if refused is not None:
            position, char = refused
            return f"cannot contain control characters (U+{ord(char):04X} at position {position})"
        return None

    def cleaned(self, value: str) -> str:
        """Text an agent makes up (an apply's message: a tool's output may carry colour escapes) made to hold:
        refused characters become U+FFFD, the end is cut."""
        return "".join("\ufffd" if self._refused(c) else c for c in value[: self.max_length])

    def _refused(self, value: str) -> tuple[int, str] | None:
        for position, char in enumerate(value, start=1):
            if unicodedata.category(char) in REFUSED_CATEGORIES and not (self.lines and char in LINE_CHARACTERS):
                return position, char
        return None


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


_INT32 = 2**31 - 1  # PostgreSQL's integer, Django's (Positive)IntegerField
# The numbers of the protocol: what each can physically be, within what the server's column holds.
Percent = Annotated[float, Range(0, 100)]  # utilisation (a check constraint on the column)
Celsius = Annotated[int, Range(-40, 200)]  # a GPU's temperature: from a cold start outdoors to past any shutdown
Watts = Annotated[float, Range(0, 10_000)]  # a GPU draws ~1.4 kW at most today
MiB = Annotated[int, Range(0, 2**24)]  # up to 16 TiB of memory on one GPU (the largest has 288 GB)
MHz = Annotated[int, Range(0, 10_000)]  # GPU clocks run at ~2 GHz
Counter32 = Annotated[int, Range(0, _INT32)]  # ECC counters (PositiveIntegerField)
Pid = Annotated[int, Range(0, 2**22)]  # Linux's PID_MAX_LIMIT
GpuIndex = Annotated[int, Range(0, 255)]  # NVML's index of a GPU in its node
MigId = Annotated[int, Range(0, 255)]  # MIG profile, GPU-instance and compute-instance ids (under 20 on any GPU)
MigSlice = Annotated[int, Range(0, 255)]  # a MIG placement's start and size, in memory slices (8 today)
NumaNode = Annotated[int, Range(-1, 1023)]  # Linux's numa_node (-1: none) up to MAX_NUMNODES
NumaCount = Annotated[int, Range(0, 1024)]
Xid = Annotated[int, Range(0, 65_535)]  # XID codes are under 200 (contracts §10)
Swappiness = Annotated[int, Range(0, 200)]  # vm.swappiness
Ratio = Annotated[int, Range(0, 100)]  # vm.dirty_ratio, vm.dirty_background_ratio, MPS thread percentages
Id = Annotated[int, Range(0, 2**63 - 1)]  # a server row's id (bigint)
Seconds = Annotated[int, Range(0, _INT32)]
Replicas = Annotated[int, Range(0, 32_767)]  # PositiveSmallIntegerField
SettingInt = Annotated[int, Range(0, _INT32)]  # a QoS policy's PositiveIntegerField, as the server sends it back
# The strings, each as long as the server's column (or what the node's source gives at most).
Secret = Annotated[str, Text(256)]  # join tokens, credentials, request keys: ~60 characters
ServiceAccountToken = Annotated[str, Text(16_384)]  # a Kubernetes JWT: ~1 KB, more with many audiences
Hostname = Annotated[str, Text(253)]  # a DNS name; Node.name
Version = Annotated[str, Text(50)]  # Node.agent_version, driver_version
CudaVersion = Annotated[str, Text(20)]
Uuid = Annotated[str, Text(64)]  # GPU and MIG device UUIDs ("GPU-" or "MIG-" and 36 characters)
Digest = Annotated[str, Text(64)]  # SHA-256 in hex, or part of one
ConfigId = Annotated[str, Text(100)]  # Node.agent_config_id
ConfigName = Annotated[str, Text(253)]  # a mig-parted config's name; Node.observed_mig_config
ProfileName = Annotated[str, Text(32)]  # MigDevice.profile
GpuName = Annotated[str, Text(100)]  # NVML's name (96 bytes at most), GFD's product; Gpu.product
PciBusId = Annotated[str, Text(32)]  # NVML's busId (32 bytes)
PciDeviceId = Annotated[str, Text(16)]
HostWord = Annotated[str, Text(32)]  # a THP mode or CPU governor (the kernel's names are at most 16)
Timestamp = Annotated[str, Text(64)]
WORDS = Text(20_000, lines=True)
Words = Annotated[str, WORDS]  # what an agent or the server says in words
Document = Annotated[str, Text(1024 * 1024, lines=True)]  # a mig-parted config file (a ConfigMap holds 1 MiB)


class Message:
    """Base of every wire message: a frozen dataclass that converts to and from plain JSON values."""

    # True: null fields are left out of to_dict(), as the server writes sparse settings (QoSPolicy.node_settings()).
    _omit_nulls: ClassVar[bool] = False

    def to_dict(self) -> dict[str, Any]:
        return _encode(self)

    @classmethod
    def from_dict(cls, data: object) -> Self:
        return _decode(cls, data, cls.__name__)


# ---------------------------------------------------------------------------------------------------------------
# register
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterRequest(Message):
    join_token: Secret = field(repr=False)
    hostname: Hostname
    agent_version: Version
    # For a node the server has already (the join token alone never takes one over): the node's current credential,
    # a Kubernetes service-account token the server has the cluster review, or a random key the agent keeps while an
    # admin approves (the same key on every ask; `request_fingerprint` of it is what the admin sees).
    credential: Secret | None = field(default=None, repr=False)
    service_account_token: ServiceAccountToken | None = field(default=None, repr=False)
    request_key: Secret | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RegisterResponse(Message):
    node_id: Id
    node_name: Hostname
    credential: Secret = field(repr=False)
    interval_seconds: Seconds


@dataclass(frozen=True)
class RegisterPending(Message):
    """202 from /register/: an admin must approve this agent's registration of an existing node; ask again later
    with the same request key."""

    node_name: Hostname
    fingerprint: Digest
    message: Words


def request_fingerprint(request_key: str) -> str:
    """The part of a request key's SHA-256 the agent logs and the admin sees: they match before approving."""
    return hashlib.sha256(request_key.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInstance(Message):
    """A MIG GPU instance and its placement in memory slices (contracts §4.1)."""

    profile: ProfileName
    profile_id: MigId
    start: MigSlice
    size: MigSlice
    gpu_instance_id: MigId


@dataclass(frozen=True)
class MigDevice(Message):
    """A MIG device (one compute instance of a GPU instance), as CUDA and the device plugin see it."""

    uuid: Uuid
    profile: ProfileName
    start: MigSlice
    size: MigSlice
    gpu_instance_id: MigId
    compute_instance_id: MigId
    memory_mib: MiB


@dataclass(frozen=True)
class GpuProcess(Message):
    """A compute process on a GPU; instance ids are null outside MIG. PIDs are host PIDs (hostPID on Kubernetes)."""

    pid: Pid
    used_memory_mib: MiB | None
    gpu_instance_id: MigId | None
    compute_instance_id: MigId | None


@dataclass(frozen=True)
class GpuReport(Message):
    """One physical GPU: identity, MIG state, processes and metrics. A metric NVML cannot read is null."""

    uuid: Uuid
    index: GpuIndex
    name: GpuName  # the NVML name, e.g. "NVIDIA H100 80GB HBM3"
    product: GpuName  # the GPU Feature Discovery label, e.g. "NVIDIA-H100-80GB-HBM3" (contracts §3.6)
    pci_bus_id: PciBusId
    pci_device_id: PciDeviceId  # "0x233010DE", as mig-parted's device-filter (§2.1)
    numa_node: NumaNode | None
    memory_total_mib: MiB
    memory_used_mib: MiB | None
    mig_capable: bool
    mig_mode_current: bool | None  # null when not MIG-capable
    mig_mode_pending: bool | None  # differs from current until the GPU is reset (§1.3)
    gpu_instances: tuple[GpuInstance, ...]
    mig_devices: tuple[MigDevice, ...]
    processes: tuple[GpuProcess, ...]
    utilization_pct: Percent | None  # null with MIG enabled: NVML has no whole-GPU figure then (§6)
    temperature_c: Celsius | None
    power_w: Watts | None
    ecc_sbe_total: Counter32 | None  # volatile corrected errors
    ecc_dbe_total: Counter32 | None  # volatile uncorrected errors
    compute_mode: ComputeMode | None
    persistence_mode: bool | None
    # Added with QoS node settings; null from older agents and where NVML cannot read them.
    power_limit_w: Watts | None = None  # the enforced limit (nvmlDeviceGetEnforcedPowerLimit)
    graphics_clock_mhz: MHz | None = None  # now (nvmlDeviceGetClockInfo)
    applications_clock_mhz: MHz | None = None  # nvmlDeviceGetApplicationsClock
    max_graphics_clock_mhz: MHz | None = None  # nvmlDeviceGetMaxClockInfo


@dataclass(frozen=True)
class XidEvent(Message):
    """An XID critical error (contracts §10); `at` is when the agent read it from NVML."""

    gpu_uuid: Uuid
    xid: Xid
    at: Timestamp
    gpu_instance_id: MigId | None = None
    compute_instance_id: MigId | None = None


@dataclass(frozen=True)
class HostSettings(Message):
    """Host tuning a QoS policy cares about, as read from /proc and /sys; null where the host has no such file."""

    thp: HostWord | None  # transparent huge pages: always | madvise | never
    swappiness: Swappiness | None
    cpu_governor: HostWord | None  # the governor of every CPU, or "mixed"
    dirty_ratio: Ratio | None
    dirty_background_ratio: Ratio | None


@dataclass(frozen=True)
class MpsSettings(Message):
    """MPS control-daemon defaults; null limits mean 100/replicas % and memory/replicas MiB (contracts §3.3)."""

    replicas: Replicas
    default_active_thread_percentage: Ratio | None = None
    pinned_device_memory_limit_mib: SettingInt | None = None


@dataclass(frozen=True)
class TimeSliceSettings(Message):
    interval: TimeSliceInterval


@dataclass(frozen=True)
class GpuSettings(Message):
    """GPU settings of a QoS policy, for every GPU of the node; null = leave as it is (contracts §5, §6)."""

    _omit_nulls: ClassVar[bool] = True

    persistence_mode: bool | None = None
    compute_mode: PolicyComputeMode | None = None
    time_slice_interval: TimeSliceInterval | None = None
    mps_active_thread_percentage: Ratio | None = None  # only with MPS: the daemon's default (§5)
    mps_pinned_memory_limit_mib: SettingInt | None = None  # only with MPS: per GPU
    gpu_clock_min_mhz: SettingInt | None = (
        None  # locked graphics clocks; one bound alone keeps the GPU's own other bound
    )
    gpu_clock_max_mhz: SettingInt | None = None
    power_limit_w: SettingInt | None = None


@dataclass(frozen=True)
class HostTuning(Message):
    """Host tuning of a QoS policy, written to /sys and /proc; null = leave as it is."""

    _omit_nulls: ClassVar[bool] = True

    transparent_hugepages: TransparentHugePages | None = None
    swappiness: Swappiness | None = None
    cpu_governor: HostWord | None = None
    dirty_ratio: Ratio | None = None
    dirty_background_ratio: Ratio | None = None


@dataclass(frozen=True)
class NodeSettings(Message):
    """What a QoS policy has an agent apply: exactly the JSON of the server's `QoSPolicy.node_settings()`."""

    gpu: GpuSettings = field(default_factory=GpuSettings)
    host: HostTuning = field(default_factory=HostTuning)


@dataclass(frozen=True)
class AppliedState(Message):
    """The desired config the node last applied successfully, and what it set."""

    config_id: ConfigId
    mig_selected: ConfigName | None = None
    mps: MpsSettings | None = None  # with the QoS policy's MPS limits merged in
    time_slice: TimeSliceSettings | None = None
    persistence_mode: bool | None = None
    node_settings: NodeSettings | None = None  # as desired; what the node runs now is in the report


@dataclass(frozen=True)
class Report(Message):
    agent_version: Version
    hostname: Hostname
    driver_version: Version
    cuda_version: CudaVersion
    numa_nodes: NumaCount | None
    gpus: tuple[GpuReport, ...]
    xid_events: tuple[XidEvent, ...]
    host: HostSettings
    applied: AppliedState | None
    inventory_digest: Digest | None = None  # inventory_digest() of this report; absent from older agents


@dataclass(frozen=True)
class GpuMetrics(Message):
    """The part of a GpuReport that moves from one report to the next: what a report of unchanged inventory
    changes on the server. The same names as GpuReport's fields, so each GPU of a report reads as one."""

    uuid: Uuid
    memory_used_mib: MiB | None
    processes: tuple[GpuProcess, ...]
    utilization_pct: Percent | None
    temperature_c: Celsius | None
    power_w: Watts | None
    ecc_sbe_total: Counter32 | None
    ecc_dbe_total: Counter32 | None


@dataclass(frozen=True)
class ReportMetrics(Message):
    """A `Report` read for its moving parts only (unknown keys are ignored, so any Report body reads as one): what
    the server records from a report whose `inventory_digest` it has recorded already."""

    agent_version: Version
    hostname: Hostname
    gpus: tuple[GpuMetrics, ...]
    xid_events: tuple[XidEvent, ...]
    inventory_digest: Digest | None = None


def inventory_digest(report: Report) -> str:
    """A hash of everything in a report but its metrics (`GpuMetrics` outside MIG devices' processes, the graphics
    clock now), XID events and agent version: equal means the node's inventory, settings and applied config are as
    before. ECC double-bit totals are in (a rise is an event to record), as are processes on MIG devices (they pin
    the devices) and the GPU settings and host tuning a QoS policy sets."""
    gpus = [
        (
            g.uuid, g.index, g.name, g.product, g.pci_bus_id, g.pci_device_id, g.numa_node, g.memory_total_mib,
            g.mig_capable, g.mig_mode_current, g.mig_mode_pending, g.ecc_dbe_total,
            g.compute_mode, g.persistence_mode, g.power_limit_w, g.applications_clock_mhz, g.max_graphics_clock_mhz,
            [(d.uuid, d.profile, d.start, d.size, d.gpu_instance_id, d.compute_instance_id, d.memory_mib)
             for d in g.mig_devices],
            sorted((p.pid, p.gpu_instance_id, p.compute_instance_id) for p in g.processes
                   if p.gpu_instance_id is not None),
        )
        for g in report.gpus
    ]  # fmt: skip
    applied = report.applied.to_dict() if report.applied else None
    key = (report.hostname, report.driver_version, report.cuda_version, report.numa_nodes, applied, report.host, gpus)
    return hashlib.sha256(repr(key).encode()).hexdigest()


@dataclass(frozen=True)
class ReportResponse(Message):
    desired_config_id: ConfigId | None


# ---------------------------------------------------------------------------------------------------------------
# desired config and outcome
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MigSettings(Message):
    """A mig-parted config file (contracts §2.1) and the name of the config in it to apply."""

    mig_parted_config: Document
    selected: ConfigName


@dataclass(frozen=True)
class SafetySettings(Message):
    """What to do when compute processes hold a GPU the change touches: wait up to wait_seconds, or force."""

    busy_policy: BusyPolicy = "wait"
    wait_seconds: Seconds = 0


@dataclass(frozen=True)
class DesiredConfig(Message):
    """What the node should run. A null section means Tessera does not manage that setting in this config."""

    config_id: ConfigId
    change_id: Id | None
    mig: MigSettings | None = None
    mps: MpsSettings | None = None
    time_slice: TimeSliceSettings | None = None
    persistence_mode: bool | None = None
    safety: SafetySettings = field(default_factory=SafetySettings)
    node_settings: NodeSettings | None = None  # the QoS policy's GPU settings and host tuning


@dataclass(frozen=True)
class Outcome(Message):
    change_id: Id | None
    config_id: ConfigId
    status: OutcomeStatus
    message: Words
    report: Report


@dataclass(frozen=True)
class ErrorBody(Message):
    """The server's one error shape (STYLE.md §8)."""

    message: Words
    errors: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# the codec: dataclass fields and their type hints drive both directions
# ---------------------------------------------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        omit = getattr(value, "_omit_nulls", False)
        return {
            f.name: _encode(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (omit and getattr(value, f.name) is None)
        }
    if isinstance(value, tuple | list):
        return [_encode(item) for item in value]
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _decode(tp: Any, value: object, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        inner, bounds = typing.get_args(tp)
        problem = bounds.problem(value)  # before converting: float(2**1100) would raise OverflowError
        if problem is not None:
            raise ProtocolError(f"{where} {problem}")
        return _decode(inner, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        (inner,) = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return _decode(inner, value, where)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ProtocolError(f"{where} must be one of {', '.join(map(str, typing.get_args(tp)))}, not {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list, not {value!r}")
        item_type = typing.get_args(tp)[0]
        return tuple(_decode(item_type, item, f"{where}[{i}]") for i, item in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, not {value!r}")
        hints = _hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _decode(hints[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{where}.{f.name} is required")
        return tp(**kwargs)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object, not {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
        return value
    raise ProtocolError(f"{where} must be {getattr(tp, '__name__', tp)}, not {value!r}")
