"""The report path's cache of credential rows (agents/report_cache.py): what it keeps, and, on PostgreSQL, that the
database's notifications drop an entry whenever what a report reads changes: a revocation, a rollout step, the
node's state, a TRUNCATE; that the writes of every report do not; and that nothing is served while the listener
cannot hear."""

import itertools
import os
import re
import time

import psycopg
import pytest
from django.db import DatabaseError, close_old_connections, connection

from agent.protocol import REPORT_PATH as REPORT
from agents import report_cache as cache_module
from agents import statements
from agents.report_cache import CHANNEL, PING, ReportCache, report_cache
from agents.statements import _CREDENTIAL_HOT, _NODE_HOT, _hot_fields
from core.audit import Actor
from fleet import agent_credentials
from fleet.models import AgentCredential, Node
from tests.agents.conftest import report_of
from tests.processes import wait_until
from worker.choices import ChangeStatus
from worker.models import NodeChange

MARKERS = itertools.count(1)

# --- the cache itself ----------------------------------------------------------------------------------------------


@pytest.fixture
def heard_cache(settings):
    """A cache whose listener is taken as hearing (no thread, no database)."""
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_CACHE_SECONDS": 300}
    cache = ReportCache()
    cache.heard(PING)
    return cache


def test_a_row_read_before_an_invalidation_is_not_kept(heard_cache):
    generation = heard_cache.generation_count
    heard_cache.heard("7")  # node 7 changed while its row was being read
    heard_cache.put("key", 7, ("row",), generation)
    assert heard_cache.get("key") is None
    heard_cache.put("key", 7, ("row",), heard_cache.generation_count)
    assert heard_cache.get("key") == ("row",)


def test_a_node_id_drops_that_node_a_star_drops_all_a_ping_nothing(heard_cache):
    for key, node_id in (("a1", 1), ("a2", 1), ("b", 2), ("c", 3)):
        heard_cache.put(key, node_id, (key,), heard_cache.generation_count)
    heard_cache.heard(PING)
    heard_cache.heard("not a node id")
    assert {key: heard_cache.get(key) for key in ("a1", "a2", "b", "c")} == {k: (k,) for k in ("a1", "a2", "b", "c")}
    heard_cache.heard("1")
    assert [heard_cache.get(key) for key in ("a1", "a2", "b")] == [None, None, ("b",)]
    heard_cache.heard("*")
    assert heard_cache.entries == {} and heard_cache.by_node == {}


def test_nothing_is_served_unless_the_listener_heard_lately(heard_cache):
    heard_cache.put("key", 1, ("row",), heard_cache.generation_count)
    heard_cache.heard_at -= cache_module.LIVENESS
    assert heard_cache.get("key") is None
    heard_cache.heard(PING)
    assert heard_cache.get("key") == ("row",)


def test_an_entry_is_read_again_after_the_max_age(heard_cache, settings):
    heard_cache.put("key", 1, ("row",), heard_cache.generation_count)
    heard_cache.entries["key"].stored_at -= 301
    assert heard_cache.get("key") is None
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_CACHE_SECONDS": 0}
    heard_cache.put("key", 1, ("row",), heard_cache.generation_count)
    assert heard_cache.get("key") is None
    assert heard_cache.generation() is None  # off: no listener starts, nothing is kept
    assert heard_cache.thread is None


def test_the_oldest_entry_makes_room(heard_cache, monkeypatch):
    monkeypatch.setattr(cache_module, "MAX_ENTRIES", 2)
    for key, node_id in (("a", 1), ("b", 2), ("c", 3)):
        heard_cache.put(key, node_id, (key,), heard_cache.generation_count)
    assert list(heard_cache.entries) == ["b", "c"] and set(heard_cache.by_node) == {2, 3}


def test_only_postgresql_has_the_notifications_a_cache_needs(heard_cache, monkeypatch):
    monkeypatch.setattr(ReportCache, "start", lambda cache: None)  # the listener is tested below, on PostgreSQL
    assert heard_cache.generation() == (heard_cache.generation_count if connection.vendor == "postgresql" else None)


# --- against PostgreSQL's notifications ------------------------------------------------------------------------------


def _require_postgresql():
    if connection.vendor != "postgresql":
        if os.environ.get("CI") == "true":
            pytest.fail("the report cache's tests need PostgreSQL; it is required in CI")
        pytest.skip("notifications are PostgreSQL's")


FAST = {"timeout": 5, "interval": 0.01}  # notifications arrive in milliseconds


def _settled(cache):
    """Every change committed so far has been heard: notifications arrive in commit order, so once a marker sent
    after them is heard (a negative node id: no node), so are they."""
    marker = str(-next(MARKERS))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, marker])
    wait_until(lambda: marker in cache.payloads, **FAST, message="the marker notification")


def _report_twice(cache, backend, client):
    """The node's first report (new inventory: read in full) and, once its writes were heard, an unchanged one."""
    body = report_of(backend).to_dict()
    assert client.post(REPORT, body, format="json").status_code == 200
    _settled(cache)
    assert client.post(REPORT, body, format="json").status_code == 200


@pytest.fixture
def cached(transactional_db, settings, monkeypatch):
    """The process's cache on, its listener started and hearing; committed transactions (notifications)."""
    _require_postgresql()
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_CACHE_SECONDS": 300}
    report_cache.stop()
    report_cache.payloads = payloads = []  # what the listener heard, for `_settled`

    def heard(payload):
        payloads.append(payload)
        ReportCache.heard(report_cache, payload)

    monkeypatch.setattr(report_cache, "heard", heard, raising=False)
    report_cache.generation()  # starts the listener
    wait_until(report_cache.live, **FAST, message="the listener hears its ping")
    yield report_cache
    report_cache.stop()
    del report_cache.payloads


@pytest.fixture
def reads(monkeypatch):
    """The credential statements that reached the database."""
    done = []
    original = statements._fetchone

    def counted(sql, params):
        done.append(params)
        return original(sql, params)

    monkeypatch.setattr(statements, "_fetchone", counted)
    return done


def _key_of(node) -> str:
    return AgentCredential.objects.get(node=node, revoked_at__isnull=True).key_id


def test_unchanged_reports_read_their_credential_once(cached, node_a, reads):
    backend, node, client = node_a
    _report_twice(cached, backend, client)
    # The first report is read in full (new inventory) and drops its row; the second reads it again and keeps it.
    assert len(reads) == 2
    for _ in range(3):
        assert client.post(REPORT, report_of(backend).to_dict(), format="json").status_code == 200
    assert len(reads) == 2
    assert cached.get(_key_of(node)) is not None


def test_a_revoked_credential_is_refused_once_the_database_says_so(cached, node_a):
    backend, node, client = node_a
    body = report_of(backend).to_dict()
    _report_twice(cached, backend, client)
    assert cached.get(_key_of(node)) is not None
    agent_credentials.agent_credential_revoke(
        actor=Actor.system("test"), credential=AgentCredential.objects.get(node=node)
    )
    started = time.monotonic()
    wait_until(
        lambda: client.post(REPORT, body, format="json").status_code == 401,
        **FAST,
        message="the revoked credential is refused",
    )
    assert time.monotonic() - started < 2.0


def test_a_rollout_step_reaches_the_next_report(cached, rollout_on_a):
    backend, node, client, change = rollout_on_a
    config_id = change.to_config["config_id"]

    def desired():
        return client.post(REPORT, report_of(backend).to_dict(), format="json").json()["desired_config_id"]

    wait_until(lambda: desired() == config_id, **FAST, message="the serving change is reported")
    NodeChange.objects.filter(pk=change.pk).update(status=ChangeStatus.FAILED)
    wait_until(lambda: desired() is None, **FAST, message="a change no longer serving is no longer reported")


def test_the_nodes_state_drops_its_entry_the_reports_own_writes_do_not(cached, node_a):
    backend, node, client = node_a
    _report_twice(cached, backend, client)
    key = _key_of(node)
    assert cached.get(key) is not None
    AgentCredential.objects.filter(key_id=key).update(last_used_at=None)
    Node.objects.filter(pk=node.pk).update(agent_version="9.9", last_seen_at=None, agent_last_seen_at=None)
    _settled(cached)
    assert cached.get(key) is not None, "the report's own kind of write must not drop the entry"
    Node.objects.filter(pk=node.pk).update(ready=False)
    wait_until(lambda: cached.get(key) is None, **FAST, message="the node's readiness drops its entry")


def test_a_truncate_drops_every_entry(cached, node_a):
    backend, node, client = node_a
    _report_twice(cached, backend, client)
    assert cached.entries
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE worker_nodechange CASCADE")
    wait_until(lambda: not cached.entries, **FAST, message="the TRUNCATE empties the cache")


def test_nothing_is_served_while_the_listener_is_cut_off_and_it_comes_back(cached, node_a):
    backend, node, client = node_a
    _report_twice(cached, backend, client)
    key = _key_of(node)
    assert cached.get(key) is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            ["tessera-agent-report-cache"],
        )
        assert cursor.fetchall() == [(True,)]
    wait_until(
        lambda: not cached.live() and cached.get(key) is None, **FAST, message="the lost listener stops the cache"
    )
    assert cached.entries == {}
    wait_until(cached.live, timeout=10, interval=0.01, message="the listener reconnects")
    client.post(REPORT, report_of(backend).to_dict(), format="json")
    assert cached.get(key) is not None


def test_the_triggers_watch_every_column_the_credential_statement_reads(cached):
    """Adding a field to the statement's hot fields without its trigger would serve a stale value."""
    with psycopg.connect(**connection.get_connection_params()) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname LIKE '%report_cache_changed'"
        ).fetchall()
    watched = {table: set(re.findall(r"\bold\.(\w+)", definition, re.IGNORECASE)) for table, definition in rows}
    credential = {f.column for f in _hot_fields(AgentCredential, _CREDENTIAL_HOT)} - {"id", "last_used_at"}
    assert credential | {"revoked_at"} <= watched["fleet_agentcredential"]
    assert {f.column for f in _hot_fields(Node, _NODE_HOT)} - {"id"} <= watched["fleet_node"]
    assert {"node_id", "status", "to_config"} <= watched["worker_nodechange"]
    assert not {"last_seen_at", "agent_last_seen_at", "agent_version"} & watched["fleet_node"]
    assert "last_used_at" not in watched["fleet_agentcredential"]


def test_a_connection_lost_under_the_credential_statement_is_replaced_at_the_end_of_the_request(
    transactional_db, node_a
):
    """The statement runs on a DB-API cursor, past Django's wrappers: its error must still mark the connection, so
    that the end of the request (close_old_connections) drops it instead of failing every report until it ages."""
    _require_postgresql()
    backend, node, client = node_a
    key = _key_of(node)
    connection.ensure_connection()
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    with pytest.raises(DatabaseError):
        statements.credential_row(key)
    close_old_connections()
    assert statements.credential_row(key)[1].pk == node.pk
