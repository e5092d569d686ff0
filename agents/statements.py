"""The report path's statements, written out: every agent calls every interval, and 10,000 nodes every 15 s are
~700 reports a second. The ORM spends ~0.5 ms compiling one select, more than the whole budget of a report, so the
statements of the usual report (credential and node, serving change, metrics, last-seen) are kept here, with table
and column names from the models."""

import functools
from collections.abc import Sequence
from datetime import UTC, datetime

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from agent.protocol import GpuMetrics, GpuReport
from agents.choices import SERVING_STATUSES
from agents.report_cache import report_cache
from fleet.models import AgentCredential, Gpu, Node
from worker.models import NodeChange

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


# Where a credential row (the credential's hot fields, then its node's) holds the node's id and the last-use time.
_NODE_ID = _hot_attnames(AgentCredential, _CREDENTIAL_HOT).index("node_id")
_LAST_USED = _hot_attnames(AgentCredential, _CREDENTIAL_HOT).index("last_used_at")


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


def _raw_cursor(db):
    """A DB-API cursor of Django's connection (same connection, same transaction): Django's cursor wrapper costs ~30
    µs a statement in query rewriting and wrappers, a tenth of a report's budget. On PostgreSQL a server-binding
    cursor: Django's own binds on the client (every value quoted into the SQL text in Python, and the server parses
    and plans each statement anew), this one sends values apart and lets statements be prepared once per connection."""
    db.ensure_connection()
    if db.vendor == "postgresql":
        return psycopg.Cursor(db.connection)
    return db.connection.cursor()


def _fetchone(sql: str, params: Sequence) -> tuple | None:
    """One row of a hot statement; prepared on PostgreSQL (parsed and planned once per connection). Errors come
    through Django's wrapper as from any cursor: Django's exceptions, and a broken connection is marked so that the
    end of the request replaces it (else every report on it would fail until CONN_MAX_AGE)."""
    db = connections[DEFAULT_DB_ALIAS]  # once: every `connection.x` is a lookup in asgiref's Local
    with db.wrap_database_errors:
        cursor = _raw_cursor(db)
        try:
            if db.vendor == "postgresql":
                cursor.execute(sql, params, prepare=True)
            else:
                cursor.execute(sql, params)
            return cursor.fetchone()
        finally:
            cursor.close()


def credential_row(key_id: str) -> tuple[AgentCredential, Node, tuple[int, str] | None] | None:
    """The active credential of this key id, its node (the fields the agent services read) and the node's serving
    change as (pk, config id), in one statement or from this process's cache (agents/report_cache.py); None when no
    active credential has this key id. The instances are new on every call: callers may change them."""
    db = connections[DEFAULT_DB_ALIAS]
    row = report_cache.get(key_id)
    if row is None:
        generation = report_cache.generation()
        found = _fetchone(_credential_sql(db.vendor), [*SERVING_STATUSES, key_id])
        if found is None:
            return None
        *values, change_id, to_config = found
        row = (tuple(map(_aware, values)), _serving(db, change_id, to_config))
        report_cache.put(key_id, row[0][_NODE_ID], row, generation)
    values, serving = row
    split = len(_hot_fields(AgentCredential, _CREDENTIAL_HOT))
    credential = _loaded(AgentCredential, _CREDENTIAL_HOT, values[:split], db.alias)
    node = _loaded(Node, _NODE_HOT, values[split:], db.alias)
    return credential, node, serving


def credential_touched(credential: AgentCredential) -> None:
    """The credential's last-use time as just written, in its cached row too (else every report would write it)."""
    row = report_cache.get(credential.key_id)
    if row is not None:
        values = list(row[0])
        values[_LAST_USED] = credential.last_used_at
        report_cache.replace(credential.key_id, (tuple(values), row[1]))


def _loaded(model, names: tuple[str, ...], values, alias: str):
    """An instance as Model.from_db makes it with the other fields deferred (they load on access), without running
    __init__ over every field of the model: these models have no init signal receivers."""
    instance = model.__new__(model)
    instance.__dict__.update(zip(_hot_attnames(model, names), values, strict=True))
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


def serving_change(node_id: int) -> tuple[int, str] | None:
    """(pk, config id) of the node's change an agent should apply now, or None."""
    db = connections[DEFAULT_DB_ALIAS]
    row = _fetchone(_serving_sql(db.vendor), [node_id, *SERVING_STATUSES])
    return _serving(db, *row) if row else None


@functools.cache
def metrics_sql(vendor: str) -> str:
    """One GPU's metrics by (node, uuid), never older than those it holds; parameters from `metric_rows`."""
    sets = [f"{_q(name)} = %s" for name in _METRIC_COLUMNS]
    sets += [f"{_q(name)} = COALESCE(%s, {_q(name)})" for name in _ECC_COLUMNS]
    # Never back in time: a flush of older buffered values after a newer write leaves the newer one.
    where = f"{_q('node_id')} = %s AND {_q('uuid')} = %s AND ({_q('metrics_at')} IS NULL OR {_q('metrics_at')} <= %s)"
    return f"UPDATE {_q(Gpu._meta.db_table)} SET {', '.join(sets)} WHERE {where}"


_METRIC_COLUMNS = ("utilization_pct", "memory_used_mib", "temperature_c", "power_w", "processes", "metrics_at")
_ECC_COLUMNS = ("ecc_sbe_total", "ecc_dbe_total")
_SEEN_COLUMNS = ("last_seen_at", "agent_last_seen_at", "agent_version")


@functools.cache
def _seen_sql(vendor: str) -> str:
    seen = _q("agent_last_seen_at")
    return (
        f"UPDATE {_q(Node._meta.db_table)} SET {', '.join(f'{_q(n)} = %s' for n in _SEEN_COLUMNS)} "
        f"WHERE {_q('id')} = %s AND ({seen} IS NULL OR {seen} <= %s)"
    )


@functools.cache
def _batched_sql(model, sets: tuple[str, ...], match: tuple[str, ...], keep: tuple[str, ...], guard: str) -> str:
    """PostgreSQL: one UPDATE of many rows from arrays, one per parameter column (`sets`, then `match`, then the
    guard's value), sent in binary (text arrays are quoted element by element in Python). `keep`: columns a null
    leaves as they are. The rows are locked first in primary-key order, the order the inventory path locks them in;
    none moves back in time (`guard`)."""
    meta = model._meta
    fields = [meta.get_field(name) for name in (*sets, *match, guard)]
    table, pk, guarded = _q(meta.db_table), _q(meta.pk.column), _q(fields[-1].column)
    arrays = ", ".join(f"%b::{field.db_type(connection)}[]" for field in fields)
    names = [f"v{i}" for i in range(len(fields))]
    columns = list(zip(fields, names, strict=True))
    assigned = []
    for field, v in columns[: len(sets)]:
        c = _q(field.column)
        assigned.append(f"{c} = COALESCE(locked.{v}, t.{c})" if field.name in keep else f"{c} = locked.{v}")
    on = " AND ".join(f"t.{_q(field.column)} = v.{v}" for field, v in columns[len(sets) : -1])
    return (
        f"WITH v AS (SELECT * FROM unnest({arrays}) AS v({', '.join(names)})), "
        f"locked AS MATERIALIZED (SELECT t.{pk} AS _pk, v.* FROM {table} t JOIN v ON {on} "
        f"ORDER BY t.{pk} FOR UPDATE OF t) "
        f"UPDATE {table} t SET {', '.join(assigned)} FROM locked "
        f"WHERE t.{pk} = locked._pk AND (t.{guarded} IS NULL OR t.{guarded} <= locked.{names[-1]})"
    )


def _columns(rows: list) -> list[list]:
    """Rows of parameters as one list per column: the arrays `_batched_sql` takes."""
    return [list(column) for column in zip(*rows, strict=True)]


def write_reports(reports: list[tuple[list, list]]) -> None:
    """Reports' metric rows and last-seen rows in one transaction. Node rows, then GPU rows, each locked in primary
    key order: the order the inventory path (inventory_record) locks them in, so the two cannot deadlock.

    On PostgreSQL each table is one statement over arrays of the rows' values (two statements a flush instead of one
    per GPU: the per-row statements cost ~145 µs of client CPU a report, bench/README.md B2), and the transaction
    commits without waiting for its WAL to reach the disk (`synchronous_commit` off for it alone): these rows are
    soft state (metrics, last-seen, agent version) that a crash may lose anyway — the buffer holds them up to an
    interval — and an asynchronous commit can lose only the last moments of such rows on a server crash, never
    leave the database inconsistent (PostgreSQL's documentation, "Asynchronous Commit")."""
    db = connections[DEFAULT_DB_ALIAS]
    seen = [row for _, row in reports]
    metrics = [row for rows, _ in reports for row in rows]
    with transaction.atomic():
        if db.vendor != "postgresql":
            with db.cursor() as cursor:
                cursor.executemany(_seen_sql(db.vendor), seen)
                cursor.executemany(metrics_sql(db.vendor), metrics)
            return
        db.ensure_connection()
        with db._prepare_cursor(psycopg.Cursor(db.connection)) as cursor:  # Django's wrapper: queries stay countable
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
            cursor.execute(_batched_sql(Node, _SEEN_COLUMNS, ("id",), (), "agent_last_seen_at"), _columns(seen))
            if metrics:
                sql = _batched_sql(Gpu, _METRIC_COLUMNS + _ECC_COLUMNS, ("node", "uuid"), _ECC_COLUMNS, "metrics_at")
                cursor.execute(sql, _columns(metrics))


def metric_rows(db, node: Node, gpus: Sequence[GpuMetrics | GpuReport], metrics_at) -> list[tuple]:
    """Parameters of `metrics_sql` per GPU (no read first); `metrics_at` as the database takes it. Stored as
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


def prep(model, name: str, value):
    """A value as the database takes it for this model field (what the ORM does on save)."""
    return model._meta.get_field(name).get_db_prep_save(value, connection)
