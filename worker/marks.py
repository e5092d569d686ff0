"""The database triggers that write ReconcileMark rows: every edit the desired or observed state of a node depends on
marks that node, its pool or everything, in the edit's own transaction, whatever wrote it (a service, the admin, the
watcher's bulk updates, an agent report's SQL, another process). The incremental reconcile tick reads the marks
(worker/reconcile.py); a full pass at a slower period checks that nothing escaped them.

Installed by migration worker.0007 and again after every `migrate` (worker.apps): SQLite drops a table's triggers
when a later migration rebuilds the table, so they are re-created idempotently rather than trusted to survive.
tests/worker/test_reconcile_incremental.py holds the list below to what desired_vs_observed reads.
"""

MARK_TABLE = "worker_reconcilemark"
# The node columns a reconcile evaluation reads (freshness is not here: the tick keeps the nodes out of the loop,
# stale or not ready, and looks at them again once back; a trigger on last-seen would fire on every report).
NODE_COLUMNS = (
    "pool_id",
    "cluster_id",
    "ready",
    "observed_mig_config",
    "observed_device_plugin_config",
    "config_state",
    "agent_config_id",
    "gone_at",
)
_SCHEDULE_POOL = "(SELECT pool_id FROM scheduling_schedule WHERE id = {row}.schedule_id)"
# table: (what a row marks: node | pool | everything, the id it marks from the row ({row} is OLD or NEW), the
# columns whose change an UPDATE marks (None: any), the events that mark)
WATCHED = {
    "fleet_node": ("node", "{row}.id", NODE_COLUMNS, ("INSERT", "UPDATE")),
    "fleet_gpu": ("node", "{row}.node_id", ("node_id", "index", "product", "gone_at"), ("INSERT", "UPDATE", "DELETE")),
    "sharing_nodepin": ("node", "{row}.node_id", None, ("INSERT", "UPDATE", "DELETE")),
    "sharing_poolsharing": ("pool", "{row}.pool_id", None, ("INSERT", "UPDATE", "DELETE")),
    "scheduling_schedule": ("pool", "{row}.pool_id", None, ("INSERT", "UPDATE", "DELETE")),
    "scheduling_schedulewindow": ("pool", _SCHEDULE_POOL, None, ("INSERT", "UPDATE", "DELETE")),
    "scheduling_scheduleexception": ("pool", _SCHEDULE_POOL, None, ("INSERT", "UPDATE", "DELETE")),
    # Rare edits with a fleet-wide reach (a profile's layouts, a policy's node settings, a cluster's MIG strategy).
    "sharing_sharingprofile": ("everything", "", None, ("UPDATE", "DELETE")),
    "sharing_qospolicy": ("everything", "", None, ("UPDATE", "DELETE")),
    "fleet_cluster": ("everything", "", ("name", "driver", "mig_strategy"), ("UPDATE", "DELETE")),
}


def _values(kind: str, expression: str, row: str) -> str:
    target = expression.format(row=row)
    if kind == "node":
        return f"({target}, NULL, FALSE)"
    if kind == "pool":
        return f"(NULL, {target}, FALSE)"
    return "(NULL, NULL, TRUE)"


def _changed(q, columns, vendor: str) -> str:
    if vendor == "postgresql":
        old = ", ".join(f"OLD.{q(c)}" for c in columns)
        new = ", ".join(f"NEW.{q(c)}" for c in columns)
        return f"(ROW({old})) IS DISTINCT FROM (ROW({new}))"
    return " OR ".join(f"OLD.{q(c)} IS NOT NEW.{q(c)}" for c in columns)


def _name(table: str, event: str) -> str:
    return f"{table}_reconcile_mark_{event.lower()}"


def install(schema_editor) -> None:
    """Create (or replace) every trigger; safe to run again."""
    vendor, q = schema_editor.connection.vendor, schema_editor.quote_name
    into = f"INSERT INTO {q(MARK_TABLE)} ({q('node_id')}, {q('pool_id')}, {q('everything')})"
    distinct = "IS DISTINCT FROM" if vendor == "postgresql" else "IS NOT"
    for table, (kind, expression, columns, events) in WATCHED.items():
        for event in events:
            row = "OLD" if event == "DELETE" else "NEW"
            when = f"WHEN ({_changed(q, columns, vendor)}) " if event == "UPDATE" and columns else ""
            statements = [f"{into} VALUES {_values(kind, expression, row)}"]
            if event == "UPDATE" and kind != "everything":  # a row moved to another node or pool marks both
                old, new = expression.format(row="OLD"), expression.format(row="NEW")
                statements.append(
                    f"{into} SELECT {_values(kind, expression, 'OLD')[1:-1]} WHERE {old} {distinct} {new}"
                )
            name = q(_name(table, event))
            if vendor == "postgresql":
                body = "".join(f"  {s};\n" for s in statements)
                schema_editor.execute(
                    f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
                    f"BEGIN\n{body}  RETURN NULL;\nEND $$"
                )
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {name} ON {q(table)}")
                action = f"EXECUTE FUNCTION {name}()"
            else:
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
                action = "BEGIN " + "".join(f"{s}; " for s in statements) + "END"
            schema_editor.execute(f"CREATE TRIGGER {name} AFTER {event} ON {q(table)} FOR EACH ROW {when}{action}")


def uninstall(schema_editor) -> None:
    vendor, q = schema_editor.connection.vendor, schema_editor.quote_name
    for table, (_kind, _expression, _columns, events) in WATCHED.items():
        for event in events:
            schema_editor.execute(
                f"DROP TRIGGER IF EXISTS {q(_name(table, event))}"
                + (f" ON {q(table)}" if vendor == "postgresql" else "")
            )
            if vendor == "postgresql":
                schema_editor.execute(f"DROP FUNCTION IF EXISTS {q(_name(table, event))}()")


def installed(connection) -> set[str]:
    """Names of the mark triggers the database has (a test holds them to WATCHED)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE %s", ["%_reconcile_mark_%"])
        else:
            cursor.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE %s", ["%_reconcile_mark_%"]
            )
        return {name for (name,) in cursor.fetchall()}


def expected() -> set[str]:
    return {_name(table, event) for table, (*_rest, events) in WATCHED.items() for event in events}
