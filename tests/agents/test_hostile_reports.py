"""A node agent's credential in an attacker's hands (issue 25): whatever one node sends, the other nodes' reports
arrive. Every number and string of the protocol is bounded (agent/protocol.py) and refused with its field named on
either path; a buffered row the database still refuses costs only its own node's report, counted and logged."""

import dataclasses
import json
import logging
import re
import types
import typing

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from agent.protocol import OUTCOME_PATH, REPORT_PATH, Report
from agents import statements
from agents.report_buffer import report_buffer
from fleet.models import Gpu, Node
from tests.agent.protocol_values import json_values
from tests.agents.conftest import agent_client, clear_throttle_counts, register, report_of, vouched

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_throttle_counts_and_writes_at_once")]


@pytest.fixture
def fleet(join_token, backends):
    """Three registered nodes that have reported their inventory once: [(backend, node, agent client)]."""
    nodes = []
    for seed in (1, 2, 3):
        backend = backends(seed=seed)
        answer = register(join_token, backend.snapshot().hostname).json()
        client = agent_client(answer["credential"])
        assert client.post(REPORT_PATH, report_of(backend).to_dict(), format="json").status_code == 200
        nodes.append((backend, Node.objects.get(pk=answer["node_id"]), client))
    return nodes


def post(client, body):
    """A report as raw JSON (NaN and Infinity included: Python's json writes them, and the server's parser reads
    them), as a hostile agent may send it."""
    return client.post(REPORT_PATH, json.dumps(body), content_type="application/json")


def last_seen(nodes) -> dict[int, object]:
    return dict(Node.objects.filter(pk__in=[n.pk for _, n, _ in nodes]).values_list("pk", "agent_last_seen_at"))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature_c", 2**63),  # the attack: OverflowError at the flush, on SQLite
        ("temperature_c", -(2**63) - 5),
        ("power_w", 2**63),
        ("power_w", 1e308),
        ("power_w", float("nan")),
        ("power_w", float("-inf")),
        ("temperature_c", 201),
        ("power_w", -1.0),
        ("memory_used_mib", 2**24 + 1),
    ],
)
def test_numbers_past_what_they_can_mean_are_refused_by_field_on_either_path(fleet, name, value, settings):
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 60}
    backend, node, client = fleet[0]
    for body in (vouched(report_of(backend)).to_dict(), report_of(backend).to_dict()):  # metrics alone; read whole
        body["gpus"][1][name] = value
        answer = post(client, body)
        assert answer.status_code == 400, answer.content
        (problem,) = answer.json()["errors"][f"gpus[1].{name}"]
        assert problem.startswith("must be from ")
        assert node.pk not in report_buffer.pending


def test_the_bounds_are_what_the_columns_hold_on_this_database(fleet, settings):
    """The extremes the protocol accepts are written by the buffered path and by the inventory path alike."""
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 60}
    backend, node, client = fleet[0]
    extremes = {"temperature_c": -40, "power_w": 10_000.0, "memory_used_mib": 2**24, "utilization_pct": 100.0}
    extremes |= {"ecc_sbe_total": 2**31 - 1, "ecc_dbe_total": 2**31 - 1}
    body = vouched(report_of(backend)).to_dict()
    body["gpus"][0].update(extremes)
    assert post(client, body).status_code == 200
    assert report_buffer.flush() == 1
    gpu = Gpu.objects.get(node=node, index=0)
    assert {name: getattr(gpu, name) for name in extremes} == extremes
    body = report_of(backend).to_dict()
    body["gpus"][1].update(extremes, temperature_c=200, power_w=0.0, memory_total_mib=2**24, numa_node=1023)
    body["numa_nodes"] = 1024
    assert post(client, body).status_code == 200  # a new inventory: written at once
    gpu = Gpu.objects.get(node=node, index=1)
    assert (gpu.temperature_c, gpu.memory_mib, gpu.numa_node, gpu.ecc_dbe_total) == (200, 2**24, 1023, 2**31 - 1)


def test_a_flush_loses_only_the_row_the_database_refuses_whatever_the_error(
    fleet, settings, monkeypatch, caplog, scrape
):
    """Past the protocol's checks (a bug, a database in trouble), a row that raises anything at all (here
    OverflowError, as SQLite raised for the issue's 2**63) costs its node's report alone: counted and logged."""
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 60}
    (bad_backend, bad, bad_client), *others = fleet
    before = last_seen(fleet)
    for backend, _, client in fleet:
        assert client.post(REPORT_PATH, vouched(report_of(backend)).to_dict(), format="json").status_code == 200
    write_reports = statements.write_reports

    def refusing(reports):
        if any(seen[3] == bad.pk for _, seen in reports):
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        write_reports(reports)

    monkeypatch.setattr("agents.report_buffer.write_reports", refusing)
    with caplog.at_level(logging.ERROR, logger="agents.report_buffer"):
        assert report_buffer.flush() == 2
    after = last_seen(fleet)
    assert after[bad.pk] == before[bad.pk]
    assert all(after[n.pk] > before[n.pk] for _, n, _ in others)
    assert f"the buffered report of node {bad.name} (id {bad.pk}) was not written" in caplog.text
    # Alone in its flush, the node's report is lost the same way: nothing raises out of the flush.
    assert bad_client.post(REPORT_PATH, vouched(report_of(bad_backend)).to_dict(), format="json").status_code == 200
    assert report_buffer.flush() == 0
    assert Node.objects.get(pk=bad.pk).agent_reports_dropped == 2
    assert scrape()["tessera_agent_reports_dropped_total"] == {(("cluster", bad.cluster.name),): 2.0}


def test_a_row_sqlite_cannot_bind_costs_only_its_node(fleet, settings):
    """The issue's flush, end to end: a value past 64 bits in a buffered row (put there past the protocol's checks)
    raised OverflowError on SQLite, which the flush did not catch, and every node's report of the flush was lost."""
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 60}
    before = last_seen(fleet)
    for backend, _, client in fleet:
        assert client.post(REPORT_PATH, vouched(report_of(backend)).to_dict(), format="json").status_code == 200
    _, bad, _ = fleet[0]
    rows, seen = report_buffer.pending[bad.pk]
    rows[0] = (*rows[0][:6], 2**63, *rows[0][7:])  # ecc_sbe_total: OverflowError (SQLite), out of range (PostgreSQL)
    assert report_buffer.flush() == 2
    after = last_seen(fleet)
    assert after[bad.pk] == before[bad.pk] and all(after[n.pk] > before[n.pk] for _, n, _ in fleet[1:])


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("driver_version", "550.54\u202e", "cannot contain control characters (U+202E at position 7)"),
        ("cuda_version", "12.4\x1b[2J", "cannot contain control characters (U+001B at position 5)"),
        ("gpus[0].name", "NVIDIA\u2028H100", "cannot contain control characters (U+2028 at position 7)"),
        ("gpus[1].product", "H100\u200b", "cannot contain control characters (U+200B at position 5)"),
        ("host.thp", "x" * 100_000, "must be at most 32 characters, not 100000"),
        ("host.cpu_governor", "performance\n", "cannot contain control characters (U+000A at position 12)"),
        ("driver_version", "5" * 51, "must be at most 50 characters, not 51"),
    ],
)
def test_agent_strings_follow_the_rules_of_names_and_a_length_per_field(fleet, field, value, problem):
    backend, node, client = fleet[0]
    body = report_of(backend).to_dict()
    body["driver_version"] = "999.1"  # a new inventory: the whole report is read
    *parents, name = re.findall(r"\w+", field)  # "gpus[0].name": gpus, 0, name
    where = body
    for key in parents:
        where = where[int(key)] if key.isdigit() else where[key]
    where[name] = value
    answer = post(client, body)
    assert answer.status_code == 400, answer.content
    assert answer.json()["errors"] == {field: [problem]}
    assert Node.objects.get(pk=node.pk).driver_version == report_of(backend).driver_version


def test_registration_and_outcome_strings_are_bounded_too(join_token, fleet):
    answer = register(join_token, "node\u202e-evil")
    assert answer.status_code == 400
    assert answer.json()["errors"] == {"hostname": ["cannot contain control characters (U+202E at position 5)"]}
    answer = register("t" * 300, "node-x")
    assert answer.json()["errors"] == {"join_token": ["must be at most 256 characters, not 300"]}
    assert "t" * 300 not in answer.content.decode()  # a secret is never echoed
    backend, _, client = fleet[0]
    outcome = {"change_id": None, "config_id": "c", "status": "failed", "message": "\x1b[31mno\x1b[0m"}
    answer = post_outcome(client, {**outcome, "report": report_of(backend).to_dict()})
    assert answer.json()["errors"] == {"message": ["cannot contain control characters (U+001B at position 1)"]}


def post_outcome(client, body):
    return client.post(OUTCOME_PATH, json.dumps(body), content_type="application/json")


# --- the fuzz: one node sends anything, anywhere in the protocol's schema ------------------------------------------


def _schema_paths(tp, path=()) -> list[tuple[tuple, object]]:
    """(path into a message's JSON, type hint) of every field under `tp`, each list's first item standing for all,
    and every list and object itself (a whole part replaced by something odd)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        (tp,) = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        origin = typing.get_origin(tp)
    if origin is tuple:
        return [(path, tp), *_schema_paths(typing.get_args(tp)[0], (*path, 0))]
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        found = [(path, tp)] if path else []
        return found + [p for f in dataclasses.fields(tp) for p in _schema_paths(hints[f.name], (*path, f.name))]
    return [(path, tp)]


REPORT_PATHS = _schema_paths(Report)


def _put(body, path: tuple, value) -> None:
    """Set the value at a path, making the objects and first list items on the way when they are absent."""
    *parents, last = path
    for key, after in zip(parents, path[1:], strict=True):
        empty = [] if isinstance(after, int) else {}
        if isinstance(key, int) and not body:
            body.append(empty)
        elif not isinstance(body[key] if isinstance(key, int) else body.get(key), type(empty)):
            body[key] = empty
        body = body[key]
    if isinstance(last, int) and not body:
        body.append(value)
    else:
        body[last] = value


mutations = st.sampled_from(REPORT_PATHS).flatmap(lambda p: st.tuples(st.just(p[0]), json_values(p[1], odd=True)))


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(changes=st.lists(mutations, min_size=1, max_size=3), vouch=st.booleans(), hostile_first=st.booleans())
@example(changes=[(("gpus", 0, "temperature_c"), 2**63)], vouch=True, hostile_first=True)  # the attack
@example(changes=[(("gpus", 1, "power_w"), -(2**63) - 5)], vouch=True, hostile_first=False)
@example(changes=[(("host", "thp"), "x" * 100_000)], vouch=False, hostile_first=True)
def test_whatever_one_node_reports_the_other_nodes_reports_arrive(fleet, settings, changes, vouch, hostile_first):
    """One node's agent sends anything, anywhere in the report's schema (bounds, past them, NaN, 2**64, wrong types,
    control characters, 100,000 characters), on the path of its choice; the other nodes report as usual. Never a
    5xx; the other nodes' last-seen and metrics are written by the next flush; what the server accepted from the
    hostile node is written too (the bounds are what the columns hold)."""
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 60}
    clear_throttle_counts()
    (backend, hostile, client), *others = fleet
    report = report_of(backend)
    body = (vouched(report) if vouch else report).to_dict()
    for path, value in changes:
        _put(body, path, value)
    before = last_seen(fleet)
    metrics_before = _metrics_at(others)

    def honest_reports():
        for other_backend, _, other_client in others:
            answer = other_client.post(REPORT_PATH, vouched(report_of(other_backend)).to_dict(), format="json")
            assert answer.status_code == 200

    if not hostile_first:
        honest_reports()
    answer = post(client, body)
    assert answer.status_code in (200, 400, 403, 409), answer.content
    event(f"{'metrics path' if vouch else 'whole report'}: {answer.status_code}")  # --hypothesis-show-statistics
    if hostile_first:
        honest_reports()
    report_buffer.flush()
    after = last_seen(fleet)
    assert all(after[node.pk] > before[node.pk] for _, node, _ in others)
    assert all(after > before for before, after in zip(metrics_before, _metrics_at(others), strict=True))
    if answer.status_code == 200:
        assert after[hostile.pk] > before[hostile.pk]


def _metrics_at(nodes) -> list:
    return list(
        Gpu.objects.filter(node__in=[n for _, n, _ in nodes]).order_by("pk").values_list("metrics_at", flat=True)
    )
