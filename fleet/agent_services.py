"""Node agents (ARCHITECTURE §4, agent/protocol.py): join tokens, per-node credentials, and what agents report.

A secret reads `<prefix>_<key id>_<secret>`: the key id finds the row, the SHA-256 of the secret is compared in
constant time. Neither join tokens nor credentials are stored, logged or shown again after they are created.

Kept apart from fleet/services.py (458 lines, past 1,300 with these); they write fleet rows through
`inventory_record` like every other source of observations.
"""

import atexit
import functools
import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.db.models import F, Q
from django.db.models.base import ModelState
from django.utils import timezone

from agent.protocol import AppliedState, GpuMetrics, GpuReport, Outcome, Report, ReportMetrics, inventory_digest
from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.choices import ClusterDriver, ConfigState, SharingMode
from fleet.models import AgentCredential, AgentJoinToken, Cluster, Gpu, GpuEvent, Node
from fleet.observations import GpuObservation, MigDeviceObservation, NodeObservation
from fleet.services import gpu_health, inventory_record
from sharing.mig import get_product
from sharing.mig.catalog import UnknownProductError
from sharing.render import GPU_RESOURCE, DevicePluginSpec, parse_device_plugin_config
from worker.choices import ChangeStatus
from worker.models import NodeChange

log = logging.getLogger(__name__)

JOIN_TOKEN_PREFIX = "tsj"
CREDENTIAL_PREFIX = "tsa"
JOIN_TOKEN_LIFETIME = timedelta(hours=24)
CREDENTIAL_TOUCH_SECONDS = 60  # last_used_at is a hint for admins: one write a minute per node is plenty
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?$")
# The states in which a change is the node's desired config: the agent applies it and the engine verifies it.
SERVING_STATUSES = (ChangeStatus.APPLYING, ChangeStatus.VERIFYING)

# What an admin does about an XID (nvidia-contracts.md §10).
XID_ACTIONS = {
    13: "graphics engine exception (kernel fault): check the workload",
    31: "GPU memory page fault: check the workload's memory use",
    43: "GPU stopped processing: reset the GPU",
    45: "preemptive cleanup timed out: check the driver version",
    48: "double-bit ECC error: replace the GPU",
    61: "internal micro-controller breakpoint: reboot the node",
    62: "internal micro-controller halt: replace the GPU",
    63: "ECC page retirement: watch the trend",
    64: "page retirement limit reached: replace the GPU",
    74: "NVLink error: check the hardware links",
    79: "GPU fell off the bus: check driver / BIOS, reseat",
    94: "contained ECC error: watch",
    95: "uncontained ECC error: replace the GPU",
}


def xid_message(xid: int) -> str:
    return f"XID {xid}: {XID_ACTIONS.get(xid, 'not in the table of actionable XIDs; see NVIDIA XID catalogue')}"


def agent_interval_seconds() -> int:
    """How often agents report; three missed reports make an agent node stale (fleet.querysets)."""
    return int(settings.TESSERA.get("AGENT_INTERVAL_SECONDS", 15))


# --- secrets -------------------------------------------------------------------------------------------------------


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _new_secret(prefix: str) -> tuple[str, str, str]:
    """(plain token, key id, hash of the secret part)."""
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return f"{prefix}_{key_id}_{secret}", key_id, _digest(secret)


def _split(token: str, prefix: str) -> tuple[str, str] | None:
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != prefix or not 1 <= len(parts[1]) <= 16 or not parts[2]:
        return None
    return parts[1], parts[2]


def _matches(secret: str, secret_hash: str) -> bool:
    return hmac.compare_digest(_digest(secret), secret_hash)


_NO_HASH = "0" * 64  # compared against when no row matched, so a miss costs what a wrong secret costs


# --- join tokens ---------------------------------------------------------------------------------------------------


@transaction.atomic
def agent_join_token_create(
    *,
    actor: Actor,
    cluster: Cluster,
    name: str,
    description: str = "",
    expires_at: datetime | None = None,
    max_uses: int | None = None,
    now=None,
) -> tuple[AgentJoinToken, str]:
    """Create a join token for an agent cluster; returns the row and the plain token, which is never shown again."""
    now = now or timezone.now()
    expires_at = expires_at or now + JOIN_TOKEN_LIFETIME
    errors: dict[str, list[str]] = {}
    if cluster.driver != ClusterDriver.AGENT:
        errors["cluster"] = [
            f"Cluster {cluster.name} is driven through Kubernetes; join tokens are for agent clusters."
        ]
    if not name.strip():
        errors["name"] = ["Give the token a name, e.g. the DaemonSet or rack it is for."]
    if expires_at <= now:
        errors["expires_at"] = ["The expiry must be in the future."]
    if max_uses is not None and max_uses < 1:
        errors["max_uses"] = ["Allow at least one registration, or leave it empty for any number until expiry."]
    if errors:
        raise ApplicationError(next(iter(errors.values()))[0], errors=errors)
    plain, key_id, secret_hash = _new_secret(JOIN_TOKEN_PREFIX)
    token = AgentJoinToken.objects.create(
        cluster=cluster,
        name=name.strip()[:100],
        description=description,
        key_id=key_id,
        secret_hash=secret_hash,
        expires_at=expires_at,
        max_uses=max_uses,
        created_by=actor.user if getattr(actor.user, "pk", None) else None,
    )
    audit_record(
        actor=actor,
        action="agent_join_token.create",
        obj=token,
        after={"cluster": cluster.name, "expires_at": expires_at.isoformat(), "max_uses": max_uses},
        now=now,
    )
    return token, plain


@transaction.atomic
def agent_join_token_revoke(*, actor: Actor, token: AgentJoinToken, now=None) -> AgentJoinToken:
    """Refuse further registrations with this token; nodes that registered with it keep their credentials."""
    now = now or timezone.now()
    if not AgentJoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
        raise ApplicationError(f"Join token {token.name} is already revoked.", status=409)
    token.refresh_from_db()
    audit_record(actor=actor, action="agent_join_token.revoke", obj=token, after={"revoked_at": now.isoformat()})
    return token


# --- registration and credentials ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """What an agent gets for a valid join token: its node and a credential shown this once."""

    node: Node
    credential: str = field(repr=False)
    interval_seconds: int


def _usable_join_token(plain: str, now) -> AgentJoinToken:
    parts = _split(plain, JOIN_TOKEN_PREFIX)
    token = AgentJoinToken.objects.select_related("cluster").filter(key_id=parts[0]).first() if parts else None
    if not _matches(parts[1] if parts else "", token.secret_hash if token else _NO_HASH) or token is None:
        raise ApplicationError("Join token unknown: check the token the agent was given.", status=403)
    if token.revoked_at is not None:
        raise ApplicationError(f"Join token {token.name} was revoked.", status=403)
    if token.expires_at <= now:
        raise ApplicationError(f"Join token {token.name} expired at {token.expires_at:%Y-%m-%d %H:%M} UTC.", status=403)
    if token.cluster.driver != ClusterDriver.AGENT:
        raise ApplicationError(f"Cluster {token.cluster.name} no longer uses the agent driver.", status=403)
    return token


@transaction.atomic
def agent_register(*, join_token: str, hostname: str, agent_version: str, now=None) -> Registration:
    """Trade a join token for a node credential; the same hostname again gets the same node and a new credential
    (the old one is revoked: its agent lost its state or the machine was reinstalled)."""
    now = now or timezone.now()
    if not HOSTNAME_RE.match(hostname):
        raise ApplicationError(
            f"Invalid hostname {hostname[:60]!r}.", errors={"hostname": ["Letters, digits, '-', '_' and '.' only."]}
        )
    token = _usable_join_token(join_token, now)
    used = (
        AgentJoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True, expires_at__gt=now)
        .filter(Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses")))
        .update(uses=F("uses") + 1, last_used_at=now)
    )
    if not used:
        raise ApplicationError(
            f"Join token {token.name} is used up: it allowed {token.max_uses} registration(s).", status=403
        )
    node, created = Node.objects.select_for_update().get_or_create(
        cluster=token.cluster,
        name=hostname,
        defaults={"agent_version": agent_version[:50], "config_state_since": now},
    )
    revoked = AgentCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
    plain, key_id, secret_hash = _new_secret(CREDENTIAL_PREFIX)
    AgentCredential.objects.create(node=node, join_token=token, key_id=key_id, secret_hash=secret_hash)
    # A re-registered agent may have lost its applied state: its next report is recorded in full.
    Node.objects.filter(pk=node.pk).update(agent_version=agent_version[:50], agent_report_hash="", gone_at=None)
    audit_record(
        actor=Actor.system("tessera-agent"),
        action="node.agent_register",
        obj=node,
        after={"join_token": token.name, "agent_version": agent_version[:50], "new_node": created},
        message="re-registered; the previous credential is revoked" if revoked else "",
        now=now,
    )
    return Registration(node=node, credential=plain, interval_seconds=agent_interval_seconds())


def agent_credential_authenticate(*, credential: str, now=None) -> AgentCredential | None:
    """The active credential this bearer secret belongs to, or None. It comes with its node (the fields the agent
    services read; others load on access) and `serving_change`: (pk, config id) of the change the node should
    apply now, or None, read by the same statement (`agent_report_record` takes it)."""
    parts = _split(credential, CREDENTIAL_PREFIX)
    row = _credential_row(parts[0]) if parts is not None else None
    if not _matches(parts[1] if parts else "", row[0].secret_hash if row else _NO_HASH) or row is None:
        return None
    found, node, found.serving_change = row
    found.node = node
    now = now or timezone.now()
    if found.last_used_at is None or (now - found.last_used_at).total_seconds() > CREDENTIAL_TOUCH_SECONDS:
        AgentCredential.objects.filter(pk=found.pk).update(last_used_at=now)
        found.last_used_at = now
    return found


@transaction.atomic
def agent_credential_revoke(*, actor: Actor, credential: AgentCredential, now=None) -> AgentCredential:
    """Revoke one agent credential: its next call gets 401 and the agent stops (exit 3) until registered again."""
    now = now or timezone.now()
    if not AgentCredential.objects.filter(pk=credential.pk, revoked_at__isnull=True).update(revoked_at=now):
        raise ApplicationError(f"Agent credential {credential.key_id} is already revoked.", status=409)
    credential.refresh_from_db()
    audit_record(
        actor=actor,
        action="node.agent_revoke",
        obj=credential.node,
        before={"credential": credential.key_id, "active": True},
        after={"credential": credential.key_id, "active": False},
        now=now,
    )
    return credential


@transaction.atomic
def node_agent_revoke(*, actor: Actor, node: Node, now=None) -> AgentCredential:
    """Revoke the node's active agent credential."""
    credential = AgentCredential.objects.select_related("node").filter(node=node, revoked_at__isnull=True).first()
    if credential is None:
        raise ApplicationError(f"Node {node.name} has no active agent credential.", status=409)
    return agent_credential_revoke(actor=actor, credential=credential, now=now)


# --- the statements of the report path ---------------------------------------------------------------------------
# Every agent calls every interval: 10,000 nodes every 15 s are ~700 reports a second. The ORM spends ~0.5 ms
# compiling one select, more than the whole budget of a report, so the statements of the usual report (credential
# and node, serving change, metrics, last-seen) are written out here, with table and column names from the models.

_CREDENTIAL_HOT = ("id", "node", "key_id", "secret_hash", "last_used_at")
_NODE_HOT = ("id", "name", "cluster", "ready", "observed_mig_config", "observed_device_plugin_config",
             "config_state", "last_error", "agent_config_id", "agent_report_hash", "gone_at")  # fmt: skip


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


@functools.cache
def _hot_fields(model, names: tuple[str, ...]) -> tuple:
    """The model's fields of `names` in concrete-field order (the order Model.from_db expects)."""
    return tuple(f for f in model._meta.concrete_fields if f.name in names)


@functools.cache
def _hot_attnames(model, names: tuple[str, ...]) -> list[str]:
    return [f.attname for f in _hot_fields(model, names)]


@functools.cache
def _credential_sql(vendor: str) -> str:
    columns = [f"c.{_q(f.column)}" for f in _hot_fields(AgentCredential, _CREDENTIAL_HOT)]
    columns += [f"n.{_q(f.column)}" for f in _hot_fields(Node, _NODE_HOT)]
    changes = NodeChange._meta
    columns += [f"s.{_q('id')}", f"s.{_q(changes.get_field('to_config').column)}"]
    return (
        f"SELECT {', '.join(columns)} FROM {_q(AgentCredential._meta.db_table)} c "
        f"INNER JOIN {_q(Node._meta.db_table)} n ON n.{_q('id')} = c.{_q('node_id')} "
        # At most one: a node has one active change (a constraint), and only that one can be serving.
        f"LEFT OUTER JOIN {_q(changes.db_table)} s ON s.{_q(changes.get_field('node').column)} = n.{_q('id')} "
        f"AND s.{_q('status')} IN (%s, %s) "
        f"WHERE c.{_q('key_id')} = %s AND c.{_q('revoked_at')} IS NULL"
    ).replace("%s", "?" if vendor == "sqlite" else "%s")


def _aware(value):
    """Raw rows carry naive UTC datetimes on SQLite (the ORM converts them; raw cursors do not)."""
    if isinstance(value, datetime) and timezone.is_naive(value):
        return value.replace(tzinfo=UTC)
    return value


def _fetchone(sql: str, params: Sequence) -> tuple | None:
    """One row through the DB-API cursor of Django's connection (same connection, same transaction): Django's
    cursor wrapper costs ~30 µs a statement in query rewriting and wrappers, a tenth of a report's budget."""
    db = connections[DEFAULT_DB_ALIAS]  # once: every `connection.x` is a lookup in asgiref's Local
    db.ensure_connection()
    cursor = db.connection.cursor()
    try:
        cursor.execute(sql, params)
        return cursor.fetchone()
    finally:
        cursor.close()


def _credential_row(key_id: str) -> tuple[AgentCredential, Node, tuple[int, str] | None] | None:
    db = connections[DEFAULT_DB_ALIAS]
    row = _fetchone(_credential_sql(db.vendor), [*SERVING_STATUSES, key_id])
    if row is None:
        return None
    *values, change_id, to_config = row
    split = len(_hot_fields(AgentCredential, _CREDENTIAL_HOT))
    credential = _loaded(AgentCredential, _CREDENTIAL_HOT, values[:split], db.alias)
    node = _loaded(Node, _NODE_HOT, values[split:], db.alias)
    return credential, node, _serving(db, change_id, to_config)


def _loaded(model, names: tuple[str, ...], values, alias: str):
    """An instance as Model.from_db makes it with the other fields deferred (they load on access), without running
    __init__ over every field of the model: these models have no init signal receivers. Datetimes made aware."""
    instance = model.__new__(model)
    instance.__dict__.update(zip(_hot_attnames(model, names), map(_aware, values), strict=True))
    instance._state = ModelState()
    instance._state.adding, instance._state.db = False, alias
    return instance


def _serving(db, change_id: int | None, to_config) -> tuple[int, str] | None:
    if change_id is None:
        return None
    return change_id, NodeChange._meta.get_field("to_config").from_db_value(to_config, None, db).get("config_id")


@functools.cache
def _serving_sql(vendor: str) -> str:
    meta = NodeChange._meta
    return (
        f"SELECT {_q('id')}, {_q(meta.get_field('to_config').column)} FROM {_q(meta.db_table)} "
        f"WHERE {_q(meta.get_field('node').column)} = %s AND {_q('status')} IN (%s, %s)"
    ).replace("%s", "?" if vendor == "sqlite" else "%s")


def _serving_change(node_id: int) -> tuple[int, str] | None:
    """(pk, config id) of the node's change an agent should apply now, or None."""
    db = connections[DEFAULT_DB_ALIAS]
    row = _fetchone(_serving_sql(db.vendor), [node_id, *SERVING_STATUSES])
    return _serving(db, *row) if row else None


@functools.cache
def _metrics_sql(vendor: str) -> str:
    sets = [f"{_q(name)} = %s" for name in _METRIC_COLUMNS]
    sets += [f"{_q(name)} = COALESCE(%s, {_q(name)})" for name in _ECC_COLUMNS]
    # Never back in time: a flush of older buffered values after a newer write leaves the newer one.
    where = f"{_q('node_id')} = %s AND {_q('uuid')} = %s AND ({_q('metrics_at')} IS NULL OR {_q('metrics_at')} <= %s)"
    return f"UPDATE {_q(Gpu._meta.db_table)} SET {', '.join(sets)} WHERE {where}"


_METRIC_COLUMNS = ("utilization_pct", "memory_used_mib", "temperature_c", "power_w", "processes", "metrics_at")
_ECC_COLUMNS = ("ecc_sbe_total", "ecc_dbe_total")


@functools.cache
def _seen_sql(vendor: str) -> str:
    names = ("last_seen_at", "agent_last_seen_at", "agent_version")
    seen = _q("agent_last_seen_at")
    return (
        f"UPDATE {_q(Node._meta.db_table)} SET {', '.join(f'{_q(n)} = %s' for n in names)} "
        f"WHERE {_q('id')} = %s AND ({seen} IS NULL OR {seen} <= %s)"
    )


def _write_reports(reports: list[tuple[list, list]]) -> None:
    """Reports' metric rows and last-seen rows in one transaction. Node rows, then GPU rows, in node id order: the
    order the inventory path (inventory_record) locks them in, so the two cannot deadlock on PostgreSQL."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(_seen_sql(connection.vendor), [seen for _, seen in reports])
        cursor.executemany(_metrics_sql(connection.vendor), [row for rows, _ in reports for row in rows])


class _ReportBuffer:
    """The writes of unchanged reports (metrics, processes, last-seen), coalesced per process and written by one
    transaction per flush instead of one per report: the usual report then costs no write of its own, and the
    workers of a SQLite deployment stop queueing for its write lock. Soft state only: a crash loses at most one
    flush interval of it, and the agent reports again within its interval. Inventory changes, events and outcomes
    are written at once."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked worker starts with its own lock and thread
        atexit.register(self._flush_at_exit)

    def _reset(self):
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[list, list]] = {}
        self.thread: threading.Thread | None = None

    def add(self, node_id: int, metric_rows: list, seen_row: list, interval: float) -> None:
        with self.lock:
            self.pending[node_id] = (metric_rows, seen_row)  # a newer report of the node replaces an older one
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, args=(interval,), name="agent-report-flush", daemon=True
                )
                self.thread.start()

    def discard(self, node_id: int) -> None:
        with self.lock:
            self.pending.pop(node_id, None)

    def flush(self) -> int:
        """Write what is pending in one transaction; returns the number of reports written. Should the batch fail,
        each node's report is written on its own, so one bad row costs only its node."""
        with self.lock:
            pending, self.pending = self.pending, {}
        if not pending:
            return 0
        reports = [pending[node_id] for node_id in sorted(pending)]
        try:
            _write_reports(reports)
            return len(reports)
        except DatabaseError:
            if len(reports) == 1:
                raise
            log.warning("a batch of %d buffered agent reports failed; writing them one by one", len(reports))
        written = 0
        for node_id, report in zip(sorted(pending), reports, strict=True):
            try:
                _write_reports([report])
                written += 1
            except DatabaseError:
                log.exception("the buffered report of node id %s was not written", node_id)
        return written

    def _flush_at_exit(self) -> None:
        try:
            self.flush()
        except Exception:  # the database may be gone already (tests, a shut-down server)
            log.warning("buffered agent reports were not written at exit", exc_info=True)

    def _run(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            try:
                self.flush()
            except Exception:  # a lost flush is one interval of metrics; the loop must go on
                log.exception("writing buffered agent reports failed")
                connection.close()


report_buffer = _ReportBuffer()


def _prep(model, name: str, value):
    return model._meta.get_field(name).get_db_prep_save(value, connection)


# --- reports -------------------------------------------------------------------------------------------------------


def _applied_to_config(node: Node, config_id: str) -> dict | None:
    """The to_config of the node's latest change to this config id (what the agent applied), if the server has it."""
    if not config_id:
        return None
    return (
        NodeChange.objects.filter(node=node, to_config__config_id=config_id)
        .order_by("-pk")
        .values_list("to_config", flat=True)
        .first()
    )


def _mig_resource(product: str, profile: str) -> str:
    try:
        found = get_product(product).mig_profile(profile)
    except UnknownProductError:
        found = None
    return found.resource_name if found else "nvidia.com/mig-" + profile.replace("+", ".")


def observed_allocatable(
    gpus: Sequence[GpuReport], applied: AppliedState | None, plugin: DevicePluginSpec | None
) -> dict[str, int]:
    """The GPU resources the node offers as reported: MIG devices that exist, whole GPUs times the replicas the
    node runs (MPS from the report; time-slicing from the applied config), named by the applied config's rules."""
    totals: dict[str, int] = {}
    for gpu in gpus:
        if gpu.mig_mode_current:
            for device in gpu.mig_devices:
                name = _mig_resource(gpu.product, device.profile)
                totals[name] = totals.get(name, 0) + 1
        else:
            totals[GPU_RESOURCE] = totals.get(GPU_RESOURCE, 0) + 1
    if plugin is not None and plugin.mig_strategy == "single" and totals:
        totals = {GPU_RESOURCE: sum(totals.values())}
    replicas = 1
    if applied is not None and applied.mps is not None:
        replicas = applied.mps.replicas
    elif applied is not None and applied.time_slice is not None and plugin is not None and plugin.sharing:
        replicas = plugin.replicas
    if replicas > 1:
        suffix = ".shared" if plugin is not None and plugin.rename_by_default else ""
        totals = {name + suffix: count * replicas for name, count in totals.items()}
    return dict(sorted(totals.items()))


def _observed_mode(report: Report) -> str:
    if any(g.mig_mode_current for g in report.gpus):
        return SharingMode.MIG
    if report.applied is not None and report.applied.mps is not None:
        return SharingMode.MPS
    if report.applied is not None and report.applied.time_slice is not None:
        return SharingMode.TIME_SLICING
    return SharingMode.PASSTHROUGH


def _plugin(to_config: dict | None) -> DevicePluginSpec | None:
    try:
        return parse_device_plugin_config(to_config.get("device_plugin", "")) if to_config else None
    except ValueError:
        return None


def _in_use_by(gpu: GpuReport, gpu_instance_id: int | None, compute_instance_id: int | None) -> str:
    pids = sorted(
        p.pid
        for p in gpu.processes
        if p.gpu_instance_id == gpu_instance_id and p.compute_instance_id in (None, compute_instance_id)
    )
    return ", ".join(f"pid {pid}" for pid in pids)[:300]


def _mig_devices(gpu: GpuReport) -> tuple[MigDeviceObservation, ...]:
    if not gpu.mig_mode_current:
        return ()
    devices, starts = [], set()
    for d in sorted(gpu.mig_devices, key=lambda d: (d.start, d.compute_instance_id)):
        if d.start in starts:
            continue  # a second compute instance of one GPU instance: Tessera tracks one device per placement
        starts.add(d.start)
        devices.append(
            MigDeviceObservation(
                profile=d.profile,
                start=d.start,
                size=d.size,
                uuid=d.uuid,
                gpu_instance_id=d.gpu_instance_id,
                compute_instance_id=d.compute_instance_id,
                memory_mib=d.memory_mib,
                in_use_by=_in_use_by(gpu, d.gpu_instance_id, d.compute_instance_id),
            )
        )
    return tuple(devices)


def _labels(report: Report) -> dict[str, str]:
    """GPU Feature Discovery's main labels, so selector pools work for agent clusters too (contracts §3.6)."""
    if not report.gpus:
        return {}
    first = report.gpus[0]
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": first.product,
        "nvidia.com/gpu.count": str(len(report.gpus)),
        "nvidia.com/gpu.memory": str(first.memory_total_mib),
        "nvidia.com/mig.capable": "true" if first.mig_capable else "false",
    }


def _newest_xids(report: Report) -> dict[str, tuple[int, datetime | None]]:
    newest: dict[str, tuple[int, datetime | None]] = {}
    for event in report.xid_events:
        at = _parse_time(event.at)
        current = newest.get(event.gpu_uuid)
        if current is None or (at and (current[1] is None or at >= current[1])):
            newest[event.gpu_uuid] = (event.xid, at)
    return newest


def _parse_time(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def _processes(gpu: GpuMetrics | GpuReport) -> list[dict]:
    return [
        {
            "pid": p.pid,
            "used_memory_mib": p.used_memory_mib,
            "gpu_instance_id": p.gpu_instance_id,
            "compute_instance_id": p.compute_instance_id,
        }
        for p in sorted(gpu.processes, key=lambda p: (p.pid, p.gpu_instance_id or 0, p.compute_instance_id or 0))
    ]


@dataclass(frozen=True)
class _ConfigView:
    observed_mig_config: str
    observed_device_plugin_config: str
    config_state: str
    last_error: str


def _config_view(node: Node, report: Report, refresh: bool, to_config: dict | None) -> _ConfigView:
    """Which config the node runs: from `applied` when it changed (or a change waits for it), else as stored, so a
    failure recorded from an outcome stands until the agent applies something new."""
    if not refresh:
        return _ConfigView(
            node.observed_mig_config, node.observed_device_plugin_config, node.config_state, node.last_error
        )
    if report.applied is None:
        return _ConfigView("", "", ConfigState.UNKNOWN, "")
    plugin_key = (to_config or {}).get("device_plugin_config", "")
    return _ConfigView(report.applied.mig_selected or "", plugin_key, ConfigState.SUCCESS, "")


# What the database can hold of a GPU's metrics (the percent check, PositiveIntegerField, finite floats): a value
# outside is refused with its field named, before it joins a buffered write that other nodes' reports share.
_INT_MAX = 2**31 - 1
_METRIC_BOUNDS = {
    "utilization_pct": (0, 100),
    "memory_used_mib": (0, _INT_MAX),
    "ecc_sbe_total": (0, _INT_MAX),
    "ecc_dbe_total": (0, _INT_MAX),
    "temperature_c": (-math.inf, math.inf),
    "power_w": (-math.inf, math.inf),
}


def _check_metrics(gpus: Sequence[GpuMetrics | GpuReport]) -> None:
    for i, gpu in enumerate(gpus):
        for name, (low, high) in _METRIC_BOUNDS.items():
            value = getattr(gpu, name)
            if value is not None and not (low <= value <= high and math.isfinite(value)):
                field = f"gpus[{i}].{name}"
                problem = f"must be a finite number{f' from {low} to {high}' if math.isfinite(high) else ''}"
                problem += f", not {value!r}"
                raise ApplicationError(f"Invalid input: {field}: {problem}", errors={field: [problem]})


def agent_report_record_metrics(
    *, node: Node, metrics: ReportMetrics, serving: tuple | None, now=None
) -> tuple[bool, str | None]:
    """Record the usual report from its moving parts alone: the agent's `inventory_digest` is the one recorded for
    the node, so its inventory, settings and applied config are those already validated and stored. Returns
    (recorded, config id the node should run). (False, None) when the whole report must be read
    (`agent_report_record`): another digest or none, XID events, a node gone or not ready, or a change waiting for
    the config the node runs to show."""
    _check_metrics(metrics.gpus)
    if (
        not metrics.inventory_digest
        or metrics.inventory_digest != node.agent_report_hash
        or metrics.hostname != node.name
        or metrics.xid_events
        or node.gone_at is not None
        or node.ready is not True
        or _waits_for_applied(node, node.agent_config_id, serving)
    ):
        return False, None
    _record_metrics(node, metrics.gpus, metrics.agent_version, now or timezone.now(), buffered=True)
    return True, serving[1] if serving else None


def agent_report_record(
    *, node: Node, report: Report, now=None, buffered: bool = True, serving: tuple | None | bool = False
) -> str | None:
    """Record a node's report (inventory when it changed, metrics, processes, XID/ECC events); returns the config
    id the node should run, or None when there is nothing for it to do. With `buffered`, an unchanged report's
    metrics are written by the next flush (TESSERA["AGENT_REPORT_FLUSH_SECONDS"], 0: at once). `serving` is the
    credential's `serving_change` when the caller has it (False: read it here)."""
    now = now or timezone.now()
    if report.hostname != node.name:
        raise ApplicationError(
            f"This agent credential belongs to node {node.name}; the report comes from {report.hostname[:100]}.",
            status=403,
        )
    _check_metrics(report.gpus)
    if serving is False:
        serving = _serving_change(node.pk)
    applied_id = report.applied.config_id if report.applied else ""
    refresh = applied_id != node.agent_config_id or _waits_for_applied(node, applied_id, serving)
    # Computed here whatever the agent claims: what is stored is what was validated.
    digest = inventory_digest(report)
    unchanged = digest == node.agent_report_hash and not refresh and not report.xid_events
    if unchanged and node.gone_at is None and node.ready is True:
        _record_metrics(node, report.gpus, report.agent_version, now, buffered=buffered)
    else:
        report_buffer.discard(node.pk)
        with transaction.atomic():
            _record_inventory(node, report, refresh, digest, now)
    node.last_seen_at = node.agent_last_seen_at = now
    return serving[1] if serving else None


def _waits_for_applied(node: Node, applied_id: str, serving: tuple | None) -> bool:
    """A change serving the config the node reports it runs, not yet shown as a success: its report must be read."""
    return bool(serving and applied_id and serving[1] == applied_id and node.config_state != ConfigState.SUCCESS)


def _record_metrics(node: Node, gpus: Sequence[GpuMetrics | GpuReport], agent_version: str, now, *, buffered: bool):
    """The usual report's writes: metrics, processes and last-seen, buffered until the next flush or at once."""
    db = connections[DEFAULT_DB_ALIAS]
    at = db.ops.adapt_datetimefield_value(now)  # what DateTimeField.get_db_prep_save ends in
    metric_rows = _metric_rows(db, node, gpus, at)
    seen_row = [at, at, agent_version[:50], node.pk, at]
    interval = settings.TESSERA.get("AGENT_REPORT_FLUSH_SECONDS", 0)
    if buffered and interval > 0:
        report_buffer.add(node.pk, metric_rows, seen_row, interval)
    else:
        _write_reports([(metric_rows, seen_row)])
    node.last_seen_at = node.agent_last_seen_at = now


def _record_inventory(node: Node, report: Report, refresh: bool, digest: str, now) -> None:
    applied_id = report.applied.config_id if report.applied else ""
    to_config = _applied_to_config(node, applied_id)
    view = _config_view(node, report, refresh, to_config)
    uuids = [g.uuid for g in report.gpus]
    stored = {
        g.uuid: g
        for g in Gpu.objects.filter(uuid__in=uuids).only("pk", "node", "uuid", "last_xid", "ecc_dbe_total", "settings")
    }
    newest = _newest_xids(report)
    gpus = []
    for g in report.gpus:
        before = stored.get(g.uuid)
        last_xid = newest[g.uuid][0] if g.uuid in newest else (before.last_xid if before else None)
        dbe = g.ecc_dbe_total if g.ecc_dbe_total is not None else (before.ecc_dbe_total if before else 0)
        gpus.append(
            GpuObservation(
                index=g.index,
                uuid=g.uuid,
                product=g.product,
                memory_mib=g.memory_total_mib,
                pci_bus_id=g.pci_bus_id,
                pci_device_id=g.pci_device_id,
                numa_node=g.numa_node,
                mig_capable=g.mig_capable,
                mig_enabled=bool(g.mig_mode_current),
                mig_pending=g.mig_mode_pending if g.mig_mode_pending != g.mig_mode_current else None,
                health=gpu_health(last_xid=last_xid, ecc_dbe_total=dbe),
                mig_devices=_mig_devices(g),
                settings=_gpu_settings(g),
            )
        )
    host = report.host.to_dict()
    observation = NodeObservation(
        name=node.name,
        labels=_labels(report),
        ready=True,
        allocatable=observed_allocatable(report.gpus, report.applied, _plugin(to_config)),
        driver_version=report.driver_version[:50],
        cuda_version=report.cuda_version[:20],
        numa_nodes=report.numa_nodes,
        observed_mode=_observed_mode(report),
        observed_mig_config=view.observed_mig_config,
        observed_device_plugin_config=view.observed_device_plugin_config,
        config_state=view.config_state,
        last_error=view.last_error,
        gpus=tuple(gpus),
        host_settings=host,
    )
    host_before = Node.objects.filter(pk=node.pk).values_list("host_settings", flat=True).first()
    inventory_record(cluster=node.cluster, nodes=[observation], now=now)
    gpus_before = {u: g.settings for u, g in stored.items() if g.node_id == node.pk}
    before, after = _settings_changes(host_before, host, gpus_before, gpus)
    if after:
        cause = (
            f"after applying config {applied_id}"
            if applied_id and applied_id != node.agent_config_id
            else "with no new config from Tessera: changed on the node"
        )
        audit_record(
            actor=Actor.system("tessera-agent"),
            action="node.settings_reported",
            obj=node,
            before=before,
            after=after,
            message=f"The agent reported {len(after)} changed setting{'s' if len(after) != 1 else ''} {cause}.",
            now=now,
        )
    _record_events(node, report, stored, now)
    with connection.cursor() as cursor:
        cursor.executemany(
            _metrics_sql(connection.vendor), _metric_rows(connection, node, report.gpus, _prep(Gpu, "metrics_at", now))
        )
    _write_health(node, newest, now)
    Node.objects.filter(pk=node.pk).update(
        last_seen_at=now,
        agent_last_seen_at=now,
        agent_version=report.agent_version[:50],
        agent_config_id=applied_id,
        agent_node_settings=_applied_node_settings(report),
        agent_report_hash=digest,
    )
    node.agent_config_id, node.agent_report_hash = applied_id, digest
    node.config_state, node.last_error = view.config_state, view.last_error
    node.observed_mig_config = view.observed_mig_config
    node.observed_device_plugin_config = view.observed_device_plugin_config
    node.ready, node.gone_at = True, None


def _gpu_settings(gpu: GpuReport) -> dict:
    """The GPU's settings a QoS policy sets, as read (null where unreadable or from an older agent): what
    Gpu.settings stores. Not the graphics clock now (it moves with load); NVML cannot read locked clocks back."""
    return {
        "compute_mode": gpu.compute_mode,
        "persistence_mode": gpu.persistence_mode,
        "power_limit_w": gpu.power_limit_w,
        "applications_clock_mhz": gpu.applications_clock_mhz,
        "max_graphics_clock_mhz": gpu.max_graphics_clock_mhz,
    }


def _applied_node_settings(report: Report) -> dict | None:
    """The QoS node settings the agent last applied, as desired ({gpu, host}): what Node.agent_node_settings stores."""
    applied = report.applied
    return applied.node_settings.to_dict() if applied is not None and applied.node_settings is not None else None


def _index_ranges(indexes: Sequence[int]) -> str:
    """[0, 1, 2, 3, 5] -> "0-3,5"."""
    runs: list[list[int]] = []
    for index in sorted(indexes):
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def _settings_changes(
    host_before: dict | None, host: dict, gpus_before: dict[str, dict | None], gpus: Sequence[GpuObservation]
) -> tuple[dict, dict]:
    """The reported settings that went from one value to another, as flat (before, after) dicts for the audit log:
    `host.<key>` and `gpu<indexes>.<key>`, one key for the GPUs that made the same change (`gpu0-7.power_limit_w`).
    A setting seen for the first time, or unreadable before or now, is not a change."""
    before, after = {}, {}
    for key, value in host.items():
        old = (host_before or {}).get(key)
        if old is not None and value is not None and old != value:
            before[f"host.{key}"], after[f"host.{key}"] = old, value
    changed: dict[tuple, list[int]] = {}
    for gpu in gpus:
        old_settings = gpus_before.get(gpu.uuid) or {}
        for key, value in (gpu.settings or {}).items():
            old = old_settings.get(key)
            if old is not None and value is not None and old != value:
                changed.setdefault((key, old, value), []).append(gpu.index)
    for (key, old, value), indexes in changed.items():
        name = f"gpu{_index_ranges(indexes)}.{key}"
        before[name], after[name] = old, value
    return before, after


def _record_events(node: Node, report: Report, stored: dict[str, Gpu], now) -> None:
    """Append XID events (once each, whatever the agent re-sends) and rises of uncorrectable ECC errors."""
    gpu_ids = dict(Gpu.objects.filter(node=node, gone_at__isnull=True).values_list("uuid", "pk"))
    events = []
    for event in report.xid_events:
        if event.gpu_uuid not in gpu_ids:
            continue  # not a GPU of this node: a credential reports for its own node only
        events.append(
            GpuEvent(
                gpu_id=gpu_ids[event.gpu_uuid],
                at=_parse_time(event.at) or now,
                kind=GpuEvent.Kind.XID,
                code=event.xid,
                gpu_instance_id=event.gpu_instance_id,
                compute_instance_id=event.compute_instance_id,
                message=xid_message(event.xid),
            )
        )
    for g in report.gpus:
        before = stored.get(g.uuid)
        previous = before.ecc_dbe_total if before else 0
        if g.ecc_dbe_total is not None and g.ecc_dbe_total > previous and g.uuid in gpu_ids:
            rise = g.ecc_dbe_total - previous
            events.append(
                GpuEvent(
                    gpu_id=gpu_ids[g.uuid],
                    at=now,
                    kind=GpuEvent.Kind.ECC,
                    code=g.ecc_dbe_total,
                    message=f"{rise} new uncorrectable ECC error(s), {g.ecc_dbe_total} since the driver loaded: "
                    "replace the GPU if they recur",
                )
            )
    if events:
        GpuEvent.objects.bulk_create(events, ignore_conflicts=True)


def _metric_rows(db, node: Node, gpus: Sequence[GpuMetrics | GpuReport], metrics_at) -> list[tuple]:
    """Parameters of `_metrics_sql` per GPU (no read first); `metrics_at` as the database takes it. Stored as
    reported: null where NVML has no figure (utilisation under MIG); ECC counters keep their last value when
    unreadable."""
    adapt_json = db.ops.adapt_json_value  # what JSONField.get_db_prep_save ends in, minus the layers
    no_processes = adapt_json([], None)
    return [
        (
            g.utilization_pct,
            g.memory_used_mib,
            g.temperature_c,
            g.power_w,
            adapt_json(_processes(g), None) if g.processes else no_processes,
            metrics_at,
            g.ecc_sbe_total,
            g.ecc_dbe_total,
            node.pk,
            g.uuid,
            metrics_at,
        )
        for g in gpus
    ]


def _write_health(node: Node, xids: dict, now) -> None:
    """Last XID and health, after a report that changed them (the rare path)."""
    changed = []
    for gpu in Gpu.objects.filter(node=node, gone_at__isnull=True):
        if gpu.uuid in xids:
            gpu.last_xid, at = xids[gpu.uuid]
            gpu.last_xid_at = at or now
        health = gpu_health(last_xid=gpu.last_xid, ecc_dbe_total=gpu.ecc_dbe_total)
        if gpu.uuid in xids or health != gpu.health:
            gpu.health = health
            changed.append(gpu)
    Gpu.objects.bulk_update(changed, ["last_xid", "last_xid_at", "health"])


# --- outcomes ------------------------------------------------------------------------------------------------------


@transaction.atomic
def agent_outcome_record(*, node: Node, outcome: Outcome, now=None) -> bool:
    """Record an apply outcome: the fresh report, then what it means for the change. Repeats change nothing; an
    outcome for a change that is not the node's, or no longer in flight, only records its report. Returns whether
    the change was acted on."""
    now = now or timezone.now()
    # At once, not buffered: the engine's next step reads the processes of this report (busy checks).
    agent_report_record(node=node, report=outcome.report, now=now, buffered=False)
    if outcome.change_id is None:
        return False
    change = NodeChange.objects.filter(pk=outcome.change_id, node=node, status__in=SERVING_STATUSES).first()
    if change is None or change.to_config.get("config_id") != outcome.config_id:
        return False
    if outcome.status == "failed":
        values = {"config_state": ConfigState.FAILED, "last_error": outcome.message[:2000], "updated_at": now}
        if node.config_state != ConfigState.FAILED:
            values["config_state_since"] = now
        if change.applied_mig_config:
            # The config it tried is the one that failed, as the node page shows it.
            values["observed_mig_config"] = change.applied_mig_config
        Node.objects.filter(pk=node.pk).update(**values)
        from worker.services import node_change_failed_on_node  # worker.services imports the fleet models

        node_change_failed_on_node(change_id=change.pk, message=outcome.message[:2000])
    elif outcome.status == "refused_busy":
        from worker.services import node_change_refused_busy

        node_change_refused_busy(change_id=change.pk, message=outcome.message[:2000], now=now)
    transaction.on_commit(lambda: _enqueue_step(change.pk, change.rollout_id))
    return True


def _enqueue_step(change_id: int, rollout_id: int) -> None:
    from worker.tasks import node_changes_step

    node_changes_step.delay([change_id], rollout_id)
