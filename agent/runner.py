"""The agent's loop: register once, then report every interval and apply what the server wants (ARCHITECTURE §4).

State lives in the state directory: `credential.json` (mode 0600; reused on restart, so the one-time join token is
needed only once) and `applied.json` (the config the node runs, valid until the next boot: MIG layouts, the MPS
daemon and time-slice lengths do not survive one, §1.3, §5).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from agent import AGENT_VERSION
from agent.backends.base import Backend, NodeSnapshot
from agent.client import (
    AuthError,
    PendingApproval,
    RejectedError,
    ServerClient,
    TransientError,
    server_url_problem,
)
from agent.errors import ApplyError, BusyError
from agent.protocol import (
    WORDS,
    AppliedState,
    DesiredConfig,
    GpuSettings,
    MpsSettings,
    NodeSettings,
    Outcome,
    RegisterPending,
    RegisterRequest,
    Report,
    XidEvent,
    inventory_digest,
    request_fingerprint,
)

EXIT_OK = 0
EXIT_FAILED = 1  # --once and the cycle failed
EXIT_USAGE = 2  # bad arguments, no way to register, or no NVIDIA driver
EXIT_AUTH = 3  # the server refused the join token or the credential
DEFAULT_INTERVAL_S = 30
MAX_BACKOFF_S = 300
CREDENTIAL_FILE = "credential.json"
APPLIED_FILE = "applied.json"
REQUEST_KEY_FILE = "request-key.json"  # kept while an admin approves a registration of an existing node


@dataclass(frozen=True)
class Credential:
    """What registration gave this node; the credential itself never appears in a repr or a log line."""

    server: str
    node_id: int
    credential: str = field(repr=False)
    node_name: str = ""
    interval_seconds: int | None = None


def _write_private(path: Path, data: dict) -> None:
    """Write JSON only the owner can read (0600), atomically, so a crash never leaves half a file."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), 0o600)  # O_CREAT's mode does not apply to a file that already existed
        json.dump(data, file)
    os.replace(temporary, path)


def load_credential(state_dir: Path, server: str) -> Credential | None:
    """The stored credential for this server, or None (none stored, or one for another server)."""
    try:
        data = json.loads((state_dir / CREDENTIAL_FILE).read_text())
        credential = Credential(**data)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as error:
        raise ValueError(f"{state_dir / CREDENTIAL_FILE} is damaged ({error}); remove it and register again") from None
    return credential if credential.server.rstrip("/") == server.rstrip("/") else None


def save_credential(state_dir: Path, credential: Credential) -> None:
    _write_private(state_dir / CREDENTIAL_FILE, asdict(credential))


def load_applied(state_dir: Path, boot_id: str) -> AppliedState | None:
    """What this node applied since it booted; after a reboot nothing of it is in force any more."""
    try:
        data = json.loads((state_dir / APPLIED_FILE).read_text())
        if data.get("boot_id") != boot_id:
            return None
        return AppliedState.from_dict(data["applied"])
    except (FileNotFoundError, ValueError, KeyError, AttributeError):
        return None  # missing or unreadable: the server will send the config again


def save_applied(state_dir: Path, boot_id: str, applied: AppliedState) -> None:
    _write_private(state_dir / APPLIED_FILE, {"boot_id": boot_id, "applied": applied.to_dict()})


def node_settings_conflict(desired: DesiredConfig) -> str | None:
    """Why the QoS policy's node settings contradict the sharing config they come with, or None."""
    if desired.node_settings is None:
        return None
    gpu = desired.node_settings.gpu
    if desired.persistence_mode is not None and gpu.persistence_mode not in (None, desired.persistence_mode):
        on_off = {True: "on", False: "off"}
        return (
            f"the sharing config turns persistence mode {on_off[desired.persistence_mode]} and the QoS policy "
            f"{on_off[gpu.persistence_mode]}"
        )
    if desired.time_slice is not None and gpu.time_slice_interval not in (None, desired.time_slice.interval):
        return (
            f"the sharing config sets time slice {desired.time_slice.interval} and the QoS policy "
            f"{gpu.time_slice_interval}"
        )
    if desired.mps is not None and gpu.compute_mode not in (None, "exclusive_process"):
        return f"MPS needs compute mode exclusive_process (contracts §3.3); the QoS policy asks for {gpu.compute_mode}"
    if desired.time_slice is not None and gpu.compute_mode in ("exclusive_process", "prohibited"):
        return f"time-slicing shares each GPU between processes; compute mode {gpu.compute_mode} does not allow that"
    if desired.mps is None and (gpu.mps_active_thread_percentage or gpu.mps_pinned_memory_limit_mib):
        return "the QoS policy sets MPS limits, but this config runs no MPS"
    if gpu.mps_active_thread_percentage is not None and not 1 <= gpu.mps_active_thread_percentage <= 100:
        return f"the MPS active thread percentage must be 1 to 100, not {gpu.mps_active_thread_percentage}"
    return None


def merged_mps(desired: DesiredConfig) -> MpsSettings | None:
    """The MPS daemon's settings: the sharing config's, with the QoS policy's limits where it sets them."""
    if desired.mps is None:
        return None
    gpu = desired.node_settings.gpu if desired.node_settings else GpuSettings()
    return replace(
        desired.mps,
        default_active_thread_percentage=gpu.mps_active_thread_percentage
        or desired.mps.default_active_thread_percentage,
        pinned_device_memory_limit_mib=gpu.mps_pinned_memory_limit_mib or desired.mps.pinned_device_memory_limit_mib,
    )


def _mps_message(mps: MpsSettings) -> str:
    limits = []
    if mps.default_active_thread_percentage:
        limits.append(f"active threads {mps.default_active_thread_percentage} %")
    if mps.pinned_device_memory_limit_mib:
        limits.append(f"pinned memory {mps.pinned_device_memory_limit_mib} MiB per GPU")
    return f"MPS for {mps.replicas} clients per GPU" + (f" ({', '.join(limits)})" if limits else "")


def _for_backend(desired: DesiredConfig, previous: AppliedState) -> tuple[NodeSettings, NodeSettings | None]:
    """The node settings the backend applies, and what it applied before: what the sharing config itself sets
    (persistence mode, time slice, MPS limits, compute mode under MPS) is left to the sharing steps."""
    settings = desired.node_settings or NodeSettings()
    gpu = replace(settings.gpu, mps_active_thread_percentage=None, mps_pinned_memory_limit_mib=None)
    if desired.persistence_mode is not None:
        gpu = replace(gpu, persistence_mode=None)
    if desired.time_slice is not None:
        gpu = replace(gpu, time_slice_interval=None)
    if desired.mps is not None:
        gpu = replace(gpu, compute_mode=None)  # MPS sets EXCLUSIVE_PROCESS itself
    before = previous.node_settings
    if before is not None:  # what the sharing steps own now is never undone here
        owned = {"time_slice_interval": None} if desired.time_slice is not None else {}
        owned |= {"compute_mode": None} if desired.mps is not None else {}
        before = replace(before, gpu=replace(before.gpu, **owned))
    return replace(settings, gpu=gpu), before


@dataclass(frozen=True)
class AgentSettings:
    server: str
    state_dir: Path
    join_token: str | None = field(default=None, repr=False)
    interval: float | None = None  # None: what the server said at registration
    hostname: str | None = None  # None: the backend's (the simulated node's, or this host's)
    once: bool = False
    insecure_lab: bool = False  # True: an http:// server URL is accepted (a lab; never in production)
    service_account_token_file: Path | None = None  # a projected Kubernetes token, presented at registration
    rotate_credential: bool = False  # register again presenting the current credential: a new one replaces it


class Agent:
    """One node's agent: a level-triggered loop, safe to stop at any point and to restart."""

    def __init__(
        self,
        settings: AgentSettings,
        backend: Backend,
        *,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: logging.Logger | None = None,
    ):
        self.settings = settings
        self.backend = backend
        self.stop = stop or threading.Event()
        self.clock = clock
        self.log = log or logging.getLogger("agent")
        self.credential = load_credential(settings.state_dir, settings.server)
        self.applied: AppliedState | None = None
        self._applied_loaded = False
        self._snapshot: NodeSnapshot | None = None
        self._xids: list[XidEvent] = []  # read from NVML, not yet accepted by the server
        self._unsent_outcome: Outcome | None = None
        self._attempted: tuple[str, int | None] | None = None
        self._waiting: tuple[tuple[str, int | None], float] | None = None
        self._rotate = settings.rotate_credential and self.credential is not None

    @property
    def interval(self) -> float:
        if self.settings.interval:
            return self.settings.interval
        if self.credential and self.credential.interval_seconds:
            return self.credential.interval_seconds
        return DEFAULT_INTERVAL_S

    # -- the loop ---------------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Loop until stopped (or one cycle with `once`); returns the process exit code."""
        problem = server_url_problem(self.settings.server, insecure_lab=self.settings.insecure_lab)
        if problem:
            self.log.error("%s", problem)
            return EXIT_USAGE
        if (self.credential is None or self.settings.rotate_credential) and not self.settings.join_token:
            self.log.error(
                "no stored credential in %s and no join token: pass --join-token, --join-token-file or set "
                "TESSERA_JOIN_TOKEN",
                self.settings.state_dir,
            )
            return EXIT_USAGE
        state_dir = self.settings.state_dir
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            self.log.error("cannot create the state directory %s: %s", state_dir, error.strerror)
            return EXIT_USAGE
        if not os.access(state_dir, os.W_OK):  # else every cycle would register anew and lose the credential
            self.log.error("the state directory %s is not writable", state_dir)
            return EXIT_USAGE
        failures = 0
        while not self.stop.is_set():
            delay = self.interval
            try:
                self.cycle()
                failures = 0
            except AuthError as error:
                refused = "agent credential" if self.credential else "join token"
                self.log.error("the server refused the %s: %s", refused, error)
                return EXIT_AUTH
            except PendingApproval as error:
                failures += 1
                self.log.warning("%s", error)
            except TransientError as error:
                failures += 1
                delay = min(self.interval * 2 ** (failures - 1), max(MAX_BACKOFF_S, self.interval))
                retry = "" if self.settings.once else f"; retrying in {delay:.0f} s"
                self.log.warning("server unreachable: %s%s", error, retry)
            except RejectedError as error:
                failures += 1
                self.log.error("the server rejected the request: %s", error)
            except Exception as error:  # a broken GPU or a full disk must not end the loop: report next time
                failures += 1
                self.log.error("cycle failed: %s: %s", type(error).__name__, error)
                self.log.debug("cycle failure", exc_info=True)
            if self.settings.once:
                return EXIT_FAILED if failures else EXIT_OK
            self.stop.wait(delay)
        return EXIT_OK

    def cycle(self) -> None:
        """Report once; when the server wants another config, fetch it, apply it and report the outcome."""
        snapshot = self._take_snapshot()
        client = self._client(snapshot)
        if self._unsent_outcome is not None:
            client.outcome(self._unsent_outcome)
            self._unsent_outcome = None
        self._xids.extend(self.backend.drain_xid_events())
        report = self._report(snapshot, tuple(self._xids))
        wanted = client.report(report).desired_config_id
        del self._xids[: len(report.xid_events)]
        self.log.debug("reported %d GPU(s); desired config %s", len(snapshot.gpus), wanted)
        if wanted is None or wanted == self._applied_id:
            self._waiting = None
            return
        desired = client.desired()
        key = (desired.config_id, desired.change_id)
        if desired.config_id == self._applied_id or key == self._attempted:
            return  # each change is tried once; the server retries with a new change_id
        result = self._apply(desired, key)
        if result is None:
            return  # waiting for busy GPUs to become idle
        status, message = result
        self._attempted = key
        log = self.log.info if status == "succeeded" else self.log.warning
        log("config %s (change %s) %s: %s", desired.config_id, desired.change_id, status, message)
        message = WORDS.cleaned(message)  # the server refuses control characters, and an outcome is sent until taken
        self._unsent_outcome = Outcome(desired.change_id, desired.config_id, status, message, self._fresh_report())
        client.outcome(self._unsent_outcome)
        self._unsent_outcome = None

    # -- helpers ----------------------------------------------------------------------------------------------------

    @property
    def _applied_id(self) -> str | None:
        return self.applied.config_id if self.applied else None

    def _take_snapshot(self) -> NodeSnapshot:
        self._snapshot = self.backend.snapshot()
        if not self._applied_loaded:
            self.applied = load_applied(self.settings.state_dir, self._snapshot.boot_id)
            self._applied_loaded = True
        if self.applied and self.applied.mps and not self.backend.mps_running():
            # The daemon died (with the agent's container, or on its own): report the config as not in force,
            # so the server's next answer has it applied again.
            self.log.warning("the MPS control daemon is not running; config %s is no longer in force", self._applied_id)
            self.applied = self._attempted = None
        return self._snapshot

    def _client(self, snapshot: NodeSnapshot) -> ServerClient:
        if self.credential is None or self._rotate:
            self._register(snapshot)
        return ServerClient(self.settings.server, credential=self.credential.credential)

    def _register(self, snapshot: NodeSnapshot) -> None:
        """Trade the join token for a credential, presenting what vouches for this agent when its node exists: the
        current credential (rotating), the pod's service-account token, or the key an admin's approval binds to."""
        token_file = self.settings.service_account_token_file
        request = RegisterRequest(
            self.settings.join_token,
            self._hostname(snapshot),
            AGENT_VERSION,
            credential=self.credential.credential if self.credential else None,
            service_account_token=token_file.read_text().strip() if token_file else None,  # rotated by the kubelet
            request_key=None if self.credential else self._request_key(),
        )
        answer = ServerClient(self.settings.server).register(request)
        if isinstance(answer, RegisterPending):
            fingerprint = request_fingerprint(request.request_key or "")
            raise PendingApproval(
                f"waiting for an admin to approve request {fingerprint} for node {answer.node_name}: {answer.message}"
            )
        self.credential = Credential(
            self.settings.server, answer.node_id, answer.credential, answer.node_name, answer.interval_seconds
        )
        save_credential(self.settings.state_dir, self.credential)
        (self.settings.state_dir / REQUEST_KEY_FILE).unlink(missing_ok=True)
        done = "new credential" if self._rotate else "registered"
        self.log.info("%s as node %s (id %s)", done, answer.node_name, answer.node_id)
        self._rotate = False

    def _request_key(self) -> str:
        """This agent's registration request key: the same on every ask (and across restarts) until registered."""
        path = self.settings.state_dir / REQUEST_KEY_FILE
        try:
            return json.loads(path.read_text())["request_key"]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            key = secrets.token_urlsafe(32)
            _write_private(path, {"request_key": key})
            return key

    def _hostname(self, snapshot: NodeSnapshot) -> str:
        return self.settings.hostname or snapshot.hostname

    def _report(self, snapshot: NodeSnapshot, xid_events: tuple[XidEvent, ...]) -> Report:
        report = Report(
            agent_version=AGENT_VERSION,
            hostname=self._hostname(snapshot),
            driver_version=snapshot.driver_version,
            cuda_version=snapshot.cuda_version,
            numa_nodes=snapshot.numa_nodes,
            gpus=snapshot.gpus,
            xid_events=xid_events,
            host=snapshot.host,
            applied=self.applied,
        )
        # With the digest, the server reads only the metrics of a report whose inventory it has recorded.
        return replace(report, inventory_digest=inventory_digest(report))

    def _fresh_report(self) -> Report:
        """The outcome's report: state after the apply; XID events stay with /report/ (agent/protocol.py)."""
        return self._report(self._take_snapshot(), ())

    def _busy_summary(self, busy: list[tuple[str, int]]) -> str:
        index = {gpu.uuid: gpu.index for gpu in self._snapshot.gpus}
        pids: dict[str, list[int]] = {}
        for uuid, pid in busy:
            pids.setdefault(uuid, []).append(pid)
        held = ", ".join(
            f"GPU {index.get(uuid, uuid)} (pid {', '.join(map(str, sorted(found)))})" for uuid, found in pids.items()
        )
        return f"compute processes hold {held}"

    def _apply(self, desired: DesiredConfig, key: tuple[str, int | None]) -> tuple[str, str] | None:
        """Apply a desired config: (status, message) for the outcome, or None while waiting for idle GPUs."""
        if desired.mps is not None and desired.time_slice is not None:
            return "failed", "MPS and time-slicing are mutually exclusive on a node (contracts §3.2)"
        conflict = node_settings_conflict(desired)
        if conflict:
            return "failed", f"{conflict}; nothing was changed"
        previous = self.applied or AppliedState(config_id="")
        mps = merged_mps(desired)
        policy = desired.node_settings.gpu if desired.node_settings else GpuSettings()
        try:
            plan = self.backend.plan_mig(desired.mig) if desired.mig else None  # refuses before touching anything
            if desired.node_settings is not None:
                self.backend.check_node_settings(desired.node_settings)  # likewise
            mps_change = mps != previous.mps
            touched = {target.uuid for target in plan.changed} if plan else set()
            if mps_change:
                touched |= {gpu.uuid for gpu in self._snapshot.gpus}  # one MPS daemon serves every GPU (§3.3)
            busy = self.backend.busy_processes(sorted(touched))
            if busy and desired.safety.busy_policy == "wait":
                now = self.clock()
                if self._waiting is None or self._waiting[0] != key:
                    self._waiting = (key, now + desired.safety.wait_seconds)
                if now < self._waiting[1]:
                    self.log.info("config %s waits for idle GPUs: %s", desired.config_id, self._busy_summary(busy))
                    return None
                self._waiting = None
                return "refused_busy", f"{self._busy_summary(busy)}; the safety policy is to wait"
            if busy:
                self.log.warning("forcing config %s: %s", desired.config_id, self._busy_summary(busy))
            self._waiting = None

            done = []
            if mps_change and previous.mps is not None:
                self.backend.apply_mps(None)  # before MIG changes: MPS and MIG do not mix (§3.3)
                done.append("MPS stopped")
            if plan and plan.changed:
                self.backend.apply_mig(plan)
                gpus = ", ".join(str(target.index) for target in plan.changed)
                done.append(f"MIG config {plan.selected} on GPU {gpus}")
            if desired.persistence_mode is not None:
                self.backend.set_persistence_mode(desired.persistence_mode)
                done.append(f"persistence mode {'on' if desired.persistence_mode else 'off'}")
            if desired.time_slice is not None:
                self.backend.set_time_slice(desired.time_slice.interval)
                done.append(f"time slice {desired.time_slice.interval}")
            elif previous.time_slice is not None and policy.time_slice_interval is None:
                self.backend.set_time_slice("default")
                done.append("time slice back to default")
            if desired.node_settings is not None or previous.node_settings is not None:
                done += self.backend.apply_node_settings(*_for_backend(desired, previous))
            if mps_change and mps is not None:
                self.backend.apply_mps(mps)
                done.append(_mps_message(mps))
        except BusyError as error:
            return "refused_busy", str(error)
        except ApplyError as error:
            return "failed", str(error)
        except Exception as error:  # NVML or the OS failed mid-way: the outcome says so, the report shows the state
            self.log.debug("apply failure", exc_info=True)
            return "failed", f"{type(error).__name__}: {error}"
        self.applied = AppliedState(
            config_id=desired.config_id,
            mig_selected=desired.mig.selected if desired.mig else None,
            mps=mps,
            time_slice=desired.time_slice,
            persistence_mode=desired.persistence_mode,
            node_settings=desired.node_settings,
        )
        save_applied(self.settings.state_dir, self._snapshot.boot_id, self.applied)
        return "succeeded", "; ".join(done) or "already in place"
