"""Notify the agent report cache (agents/report_cache.py) when what a report's credential statement reads changes:
`pg_notify('tessera_agent_nodes', <node id>)` from a row trigger on each of its three tables, `'*'` on TRUNCATE.
An UPDATE notifies only when a column that statement reads changes (tests/agents/test_report_cache.py holds these
lists to agents/statements.py): the writes of every report (last-seen, metrics, a credential's last use) do not.
PostgreSQL only; CREATE TRIGGER changes the catalog alone (a brief SHARE ROW EXCLUSIVE lock, nothing scanned)."""

from django.db import migrations

CHANNEL = "tessera_agent_nodes"
FUNCTION = "tessera_agent_report_changed"
# table: (column holding the node id, columns whose change an UPDATE notifies; None: every UPDATE)
WATCHED = {
    "fleet_agentcredential": ("node_id", ("node_id", "key_id", "secret_hash", "revoked_at")),
    "fleet_node": (
        "id",
        ("cluster_id", "name", "ready", "observed_mig_config", "observed_device_plugin_config", "config_state",
         "last_error", "agent_config_id", "agent_report_hash", "gone_at"),
    ),  # fmt: skip
    "worker_nodechange": ("node_id", ("node_id", "status", "to_config")),
}


def create_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    q = schema_editor.quote_name
    # The node's id is `id` on fleet_node and `node_id` elsewhere (the trigger's argument): branches, not to_jsonb()
    # of whole rows, since a rollout fires this for every transition of every NodeChange.
    schema_editor.execute(
        f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        "BEGIN\n"
        "  IF TG_OP = 'TRUNCATE' THEN\n"
        f"    PERFORM pg_notify('{CHANNEL}', '*');\n"
        "  ELSIF TG_ARGV[0] = 'id' THEN\n"
        f"    IF TG_OP <> 'INSERT' THEN PERFORM pg_notify('{CHANNEL}', OLD.id::text); END IF;\n"
        f"    IF TG_OP <> 'DELETE' THEN PERFORM pg_notify('{CHANNEL}', NEW.id::text); END IF;\n"
        "  ELSE\n"
        f"    IF TG_OP <> 'INSERT' THEN PERFORM pg_notify('{CHANNEL}', OLD.node_id::text); END IF;\n"
        f"    IF TG_OP <> 'DELETE' THEN PERFORM pg_notify('{CHANNEL}', NEW.node_id::text); END IF;\n"
        "  END IF;\n"  # the same payload twice in a transaction is delivered once
        "  RETURN NULL;\n"
        "END $$"
    )
    for table, (node_column, columns) in WATCHED.items():
        old = ", ".join(f"OLD.{q(c)}" for c in columns)
        new = ", ".join(f"NEW.{q(c)}" for c in columns)
        inserts = " OR INSERT" if table == "worker_nodechange" else ""
        schema_editor.execute(
            f"CREATE TRIGGER {q(f'{table}_report_cache_changed')} AFTER UPDATE ON {q(table)} FOR EACH ROW "
            f"WHEN ((ROW({old})) IS DISTINCT FROM (ROW({new}))) EXECUTE FUNCTION {FUNCTION}('{node_column}')"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {q(f'{table}_report_cache_rows')} AFTER DELETE{inserts} ON {q(table)} FOR EACH ROW "
            f"EXECUTE FUNCTION {FUNCTION}('{node_column}')"
        )
        schema_editor.execute(
            f"CREATE TRIGGER {q(f'{table}_report_cache_truncate')} AFTER TRUNCATE ON {q(table)} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}('{node_column}')"
        )


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    q = schema_editor.quote_name
    for table in WATCHED:
        for event in ("changed", "rows", "truncate"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {q(f'{table}_report_cache_{event}')} ON {q(table)}")
    schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")


class Migration(migrations.Migration):
    dependencies = [("fleet", "0014_gpu_unhealthy_live_index"), ("worker", "0006_kueue_quota_write")]

    operations = [migrations.RunPython(create_triggers, drop_triggers)]
