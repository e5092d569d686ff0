"""Report ingest, the hot path: every agent reports every interval. The usual report changes only metrics and
last-seen, written by the statements of agents/statements.py (buffered, agents/report_buffer.py); a report whose
inventory, applied config or events are new goes through `inventory_record` like every source of observations."""

from collections.abc import Sequence

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.utils import timezone

from agent.protocol import GpuMetrics, GpuReport, Report, ReportMetrics, inventory_digest
from agents.claims import refuse_foreign_uuids, release_stale_mig_uuids, uuid_conflicts_resolve
from agents.observations import (
    ConfigView,
    applied_node_settings,
    config_view,
    gpu_observation,
    newest_xids,
    node_observation,
    parse_time,
    settings_changes,
    xid_message,
)
from agents.report_buffer import report_buffer
from agents.report_cache import report_cache
from agents.statements import metric_rows, metrics_sql, prep, serving_change, write_reports
from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.choices import ConfigState
from fleet.health import gpu_health
from fleet.models import Gpu, GpuEvent, Node
from fleet.observations import NodeObservation
from fleet.services import inventory_record
from worker.models import NodeChange


def agent_report_record_metrics(
    *, node: Node, metrics: ReportMetrics, serving: tuple | None, now=None
) -> tuple[bool, str | None]:
    """Record the usual report from its moving parts alone: the agent's `inventory_digest` is the one recorded for
    the node, so its inventory, settings and applied config are those already validated and stored. Returns
    (recorded, config id the node should run). (False, None) when the whole report must be read
    (`agent_report_record`): another digest or none, XID events, a node gone or not ready, or a change waiting for
    the config the node runs to show."""
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
    if serving is False:
        serving = serving_change(node.pk)
    applied_id = report.applied.config_id if report.applied else ""
    refresh = applied_id != node.agent_config_id or _waits_for_applied(node, applied_id, serving)
    # Computed here whatever the agent claims: what is stored is what was validated.
    digest = inventory_digest(report)
    unchanged = digest == node.agent_report_hash and not refresh and not report.xid_events
    if unchanged and node.gone_at is None and node.ready is True:
        _record_metrics(node, report.gpus, report.agent_version, now, buffered=buffered)
    else:
        report_buffer.discard(node.pk)
        _record_own_inventory(node, report, refresh, digest, now)
        report_cache.drop_node(node.pk)  # this process's next report reads what was written (others hear it)
    node.last_seen_at = node.agent_last_seen_at = now
    return serving[1] if serving else None


def _waits_for_applied(node: Node, applied_id: str, serving: tuple | None) -> bool:
    """A change serving the config the node reports it runs, not yet shown as a success: its report must be read."""
    return bool(serving and applied_id and serving[1] == applied_id and node.config_state != ConfigState.SUCCESS)


def _record_metrics(node: Node, gpus: Sequence[GpuMetrics | GpuReport], agent_version: str, now, *, buffered: bool):
    """The usual report's writes: metrics, processes and last-seen, buffered until the next flush or at once."""
    db = connections[DEFAULT_DB_ALIAS]
    at = db.ops.adapt_datetimefield_value(now)  # what DateTimeField.get_db_prep_save ends in
    rows = metric_rows(db, node, gpus, at)
    seen_row = [at, at, agent_version[:50], node.pk, at]
    if buffered and settings.TESSERA.get("AGENT_REPORT_FLUSH_SECONDS", 0) > 0:
        report_buffer.add(node.pk, rows, seen_row)
    else:
        write_reports([(rows, seen_row)])
    node.last_seen_at = node.agent_last_seen_at = now


# --- the inventory path: a report with something new --------------------------------------------------------------


_STORED_GPU_FIELDS = ("pk", "node", "uuid", "last_xid", "ecc_dbe_total", "settings")  # what a report is compared with


def _record_own_inventory(node: Node, report: Report, refresh: bool, digest: str, now) -> None:
    """Record a new inventory if it names only UUIDs that are new or already the node's; else refuse it (409). A
    UUID another node's report took meanwhile (past the check) is refused the same way, not as a 500."""
    refuse_foreign_uuids(node=node, report=report, now=now)
    try:
        with transaction.atomic():
            release_stale_mig_uuids(node, report)
            _record_inventory(node, report, refresh, digest, now)
            uuid_conflicts_resolve(node=node, now=now)
    except IntegrityError:
        refuse_foreign_uuids(node=node, report=report, now=now)
        raise


def _record_inventory(node: Node, report: Report, refresh: bool, digest: str, now) -> None:
    """A report whose inventory, applied config or events are new: the node and its GPUs through inventory_record,
    then what only agents report (settings changes, XID and ECC events, metrics, health), and the report's digest."""
    applied_id = report.applied.config_id if report.applied else ""
    to_config = _applied_to_config(node, applied_id)
    view = config_view(node, report, refresh, to_config)
    uuids = [g.uuid for g in report.gpus]
    stored = {g.uuid: g for g in Gpu.objects.filter(uuid__in=uuids).only(*_STORED_GPU_FIELDS)}
    newest = newest_xids(report)
    gpus = [gpu_observation(g, stored.get(g.uuid), newest.get(g.uuid)) for g in report.gpus]
    observation = node_observation(node, report, view, gpus, to_config)
    host_before = Node.objects.filter(pk=node.pk).values_list("host_settings", flat=True).first()
    inventory_record(cluster=node.cluster, nodes=[observation], move_live_gpus=False, now=now)
    _audit_settings_changes(node, applied_id, observation, host_before, stored, now)
    _record_events(node, report, stored, now)
    with connection.cursor() as cursor:
        rows = metric_rows(connection, node, report.gpus, prep(Gpu, "metrics_at", now))
        cursor.executemany(metrics_sql(connection.vendor), rows)
    _write_health(node, newest, now)
    _mark_recorded(node, report, applied_id, digest, view, now)


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


def _audit_settings_changes(
    node: Node, applied_id: str, observation: NodeObservation, host_before: dict | None, stored: dict[str, Gpu], now
) -> None:
    """Audit the reported settings that changed since the last report, saying whether Tessera's config did it."""
    gpus_before = {u: g.settings for u, g in stored.items() if g.node_id == node.pk}
    before, after = settings_changes(host_before, observation.host_settings, gpus_before, observation.gpus)
    if not after:
        return
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
                at=parse_time(event.at) or now,
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


def _mark_recorded(node: Node, report: Report, applied_id: str, digest: str, view: ConfigView, now) -> None:
    """The report is recorded: last-seen, the applied config and its settings, and the digest that lets the next
    unchanged report take the fast path; the in-memory node follows."""
    Node.objects.filter(pk=node.pk).update(
        last_seen_at=now,
        agent_last_seen_at=now,
        agent_version=report.agent_version[:50],
        agent_config_id=applied_id,
        agent_node_settings=applied_node_settings(report),
        agent_report_hash=digest,
    )
    node.agent_config_id, node.agent_report_hash = applied_id, digest
    node.config_state, node.last_error = view.config_state, view.last_error
    node.observed_mig_config = view.observed_mig_config
    node.observed_device_plugin_config = view.observed_device_plugin_config
    node.ready, node.gone_at = True, None
