"""The node agent's endpoints (agent/protocol.py) and their admin: join tokens, registration, credentials that act on
their own node only, report ingest (idempotent, MIG placements, processes, XID/ECC events), desired configs and
outcomes driving the rollout engine, throttling, and the OpenAPI schema."""

import dataclasses
import typing
from datetime import timedelta

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import include, path
from django.utils import timezone
from drf_spectacular.drainage import GENERATOR_STATS
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from agent import protocol
from agent.protocol import (
    AppliedState,
    DesiredConfig,
    MpsSettings,
    NodeSettings,
    Outcome,
    Report,
    TimeSliceSettings,
    XidEvent,
)
from agents.api.serializers import protocol_decode
from agents.api.views import AgentRegisterView, AgentReportView
from agents.authentication import AgentRateThrottle, AgentRegisterThrottle
from agents.observations import observed_allocatable
from agents.report_buffer import report_buffer
from core.audit import Actor
from core.models import AuditEvent
from core.services import api_token_rotate
from fleet import agent_credentials
from fleet.api.protocol import PROTOCOL_MIRRORS
from fleet.models import AgentCredential, AgentJoinToken, Gpu, GpuEvent, MigDevice, Node
from fleet.selectors import gpu_events
from sharing import services as sharing_services
from sharing.render import DevicePluginSpec
from tests.agents.conftest import (
    H100,
    agent_client,
    clear_throttle_counts,
    fast_path_writes,
    register,
    report_of,
    vouched,
    written,
)
from tests.factories import ClusterFactory, NodeFactory, NodePoolFactory
from worker import reconcile
from worker import services as worker_services
from worker.choices import ChangeStatus
from worker.drivers.agent import AgentDriver
from worker.models import NodeChange, Rollout

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_throttle_counts_and_writes_at_once")]
REGISTER, REPORT, DESIRED, OUTCOME = (
    protocol.REGISTER_PATH,
    protocol.REPORT_PATH,
    protocol.DESIRED_PATH,
    protocol.OUTCOME_PATH,
)
TIMESTAMPS = {"last_seen_at", "agent_last_seen_at", "metrics_at", "updated_at", "last_used_at"}


def _rows(node) -> dict:
    """Every stored observation of a node, without the moments of observation."""

    def plain(obj):
        return {k: v for k, v in model_to_dict(obj).items() if k not in TIMESTAMPS}

    gpus = Gpu.objects.filter(node=node).order_by("uuid")
    return {
        "node": plain(Node.objects.get(pk=node.pk)),
        "gpus": [plain(g) for g in gpus],
        "mig": [plain(m) for m in MigDevice.objects.filter(gpu__node=node).order_by("gpu__uuid", "start")],
        "events": [plain(e) for e in GpuEvent.objects.filter(gpu__node=node)],
    }


# --- join tokens -----------------------------------------------------------------------------------------------


def test_join_token_is_shown_once_and_stored_as_a_hash(admin_api, cluster):
    created = admin_api.post("/api/v1/agent-join-tokens/", {"cluster": cluster.pk, "name": "daemonset"}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    plain = body["token"]
    token = AgentJoinToken.objects.get(pk=body["id"])
    assert body["state"] == "active" and body["max_uses"] is None and body["uses"] == 0
    assert timedelta(hours=23, minutes=59) < token.expires_at - timezone.now() <= timedelta(hours=24)
    assert plain not in str(model_to_dict(token)) and plain.split("_")[-1] not in token.secret_hash
    listed = admin_api.get("/api/v1/agent-join-tokens/").json()["results"]
    detail = admin_api.get(f"/api/v1/agent-join-tokens/{token.pk}/").json()
    assert "token" not in listed[0] and "token" not in detail and plain not in str(listed) + str(detail)
    assert AuditEvent.objects.filter(action="agent_join_token.create", object_id=str(token.pk)).exists()


def test_join_tokens_only_for_agent_clusters_and_admins(admin_api, operator_api, viewer_api, cluster):
    kubernetes = ClusterFactory(driver="kubernetes")
    refused = admin_api.post("/api/v1/agent-join-tokens/", {"cluster": kubernetes.pk, "name": "x"}, format="json")
    assert refused.status_code == 400 and "cluster" in refused.json()["errors"]
    for client in (operator_api, viewer_api):
        assert client.get("/api/v1/agent-join-tokens/").status_code == 403
        assert client.post("/api/v1/agent-join-tokens/", {"cluster": cluster.pk, "name": "x"}).status_code == 403
        assert client.get("/api/v1/agent-credentials/").status_code == 403


def test_revoking_a_join_token(admin_api, cluster, join_token):
    token = AgentJoinToken.objects.get()
    assert admin_api.post(f"/api/v1/agent-join-tokens/{token.pk}/revoke/").json()["state"] == "revoked"
    assert admin_api.post(f"/api/v1/agent-join-tokens/{token.pk}/revoke/").status_code == 409
    refused = register(join_token, "node-x")
    assert refused.status_code == 403 and "revoked" in refused.json()["message"]


# --- registration ------------------------------------------------------------------------------------------------


def test_register_creates_the_node_and_a_credential_for_it(join_token, cluster):
    answer = register(join_token, "gpu-node-1")
    assert answer.status_code == 201
    body = answer.json()
    assert set(body) == {"node_id", "node_name", "credential", "interval_seconds"}
    assert body["node_name"] == "gpu-node-1" and body["interval_seconds"] == 15
    node = Node.objects.get(pk=body["node_id"])
    assert node.cluster == cluster and node.agent_version == "0.1.0"
    credential = AgentCredential.objects.get(node=node)
    assert credential.is_active and body["credential"] not in str(model_to_dict(credential))
    assert AgentJoinToken.objects.get().uses == 1
    assert AuditEvent.objects.filter(action="node.agent_register", object_id=str(node.pk)).exists()
    assert Node.objects.stale().filter(pk=node.pk).exists()  # registered, not reported yet


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("expired", "expired"),
        ("revoked", "revoked"),
        ("used_up", "used up"),
        ("unknown", "unknown"),
        ("garbage", "unknown"),
    ],
)
def test_register_refuses_bad_join_tokens(case, message, cluster, admin_user):
    token, plain = agent_credentials.agent_join_token_create(
        actor=Actor.for_user(admin_user), cluster=cluster, name="t", max_uses=1
    )
    if case == "expired":
        AgentJoinToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    elif case == "revoked":
        agent_credentials.agent_join_token_revoke(actor=Actor.for_user(admin_user), token=token)
    elif case == "used_up":
        assert register(plain, "first").status_code == 201
    elif case == "unknown":
        plain = plain[:-4] + "AAAA"
    else:
        plain = "not-a-token"
    answer = register(plain, "second")
    assert answer.status_code == 403
    assert message in answer.json()["message"] and answer.json()["errors"] == {}
    assert not Node.objects.filter(name="second").exists()


def test_register_validates_the_body(join_token):
    missing = APIClient().post(REGISTER, {"join_token": join_token, "hostname": "n"}, format="json")
    assert missing.status_code == 400
    assert missing.json()["errors"] == {"agent_version": ["is required"]}
    bad = register(join_token, "no spaces allowed")
    assert bad.status_code == 400 and "hostname" in bad.json()["errors"]


def test_reregistering_with_the_current_credential_keeps_the_node_and_revokes_the_old_one(join_token, backends):
    backend = backends(seed=1)
    first = register(join_token, backend.snapshot().hostname).json()
    node, old_client = Node.objects.get(pk=first["node_id"]), agent_client(first["credential"])
    assert old_client.post(REPORT, report_of(backend).to_dict(), format="json").status_code == 200
    again = register(join_token, node.name, fields={"credential": first["credential"]}).json()
    assert again["node_id"] == node.pk
    assert Node.objects.filter(name=node.name).count() == 1
    assert AgentCredential.objects.filter(node=node).count() == 2
    assert AgentCredential.objects.filter(node=node, revoked_at__isnull=True).count() == 1
    assert AgentJoinToken.objects.get().uses == 1  # only new nodes count against the token
    refused = old_client.post(REPORT, report_of(backend).to_dict(), format="json")
    assert refused.status_code == 401
    assert refused.json() == {"message": "Agent credential revoked or unknown.", "errors": {}}
    assert (
        agent_client(again["credential"]).post(REPORT, report_of(backend).to_dict(), format="json").status_code == 200
    )


# --- reports -----------------------------------------------------------------------------------------------------


def test_report_records_inventory_metrics_and_processes(node_a):
    backend, node, client = node_a
    pid = backend.sim.start_process(0, used_mib=2048)
    report = report_of(backend)
    answer = client.post(REPORT, report.to_dict(), format="json")
    assert answer.status_code == 200 and answer.json() == {"desired_config_id": None}
    node.refresh_from_db()
    assert node.ready is True and node.agent_version == "0.1.0" and node.driver_version == report.driver_version
    assert node.last_seen_at == node.agent_last_seen_at and node.numa_nodes == report.numa_nodes
    assert node.observed_mode == "passthrough" and node.allocatable == {"nvidia.com/gpu": 2}
    assert node.labels["nvidia.com/gpu.product"] == H100 and node.labels["nvidia.com/gpu.count"] == "2"
    assert Node.objects.fresh().filter(pk=node.pk).exists()
    gpus = {g.index: g for g in Gpu.objects.filter(node=node)}
    first = report.gpus[0]
    assert gpus[0].uuid == first.uuid and gpus[0].product == H100 and gpus[0].pci_bus_id == first.pci_bus_id
    assert gpus[0].memory_mib == first.memory_total_mib and gpus[0].numa_node == first.numa_node
    assert gpus[0].mig_capable and not gpus[0].mig_enabled and gpus[0].mig_pending is None
    assert gpus[0].health == "healthy" and gpus[0].temperature_c == first.temperature_c
    assert gpus[0].processes == [
        {"pid": pid, "used_memory_mib": 2048, "gpu_instance_id": None, "compute_instance_id": None}
    ]
    assert gpus[1].processes == []
    assert AgentDriver(node.cluster).busy_pods([node.name])[node.name][0].name == f"pid {pid} on GPU 0"


def test_the_same_report_twice_changes_no_rows_and_costs_two_writes(node_a):
    backend, node, client = node_a
    backend.apply_mig(backend.plan_mig(_mig({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1})))
    body = report_of(backend, xids=[XidEvent(backend.snapshot().gpus[0].uuid, 13, "2026-11-22T01:00:00.000001Z")])
    client.post(REPORT, body.to_dict(), format="json")
    before = _rows(node)
    client.post(REPORT, body.to_dict(), format="json")
    assert _rows(node) == before
    assert GpuEvent.objects.count() == 1
    plain = report_of(backend)  # no XID events: the usual report
    client.post(REPORT, plain.to_dict(), format="json")
    with CaptureQueriesContext(connection) as queries:
        assert client.post(REPORT, plain.to_dict(), format="json").status_code == 200
    assert _rows(node) == before
    # Two reads (credential with node, serving change) go through the DB-API cursor, unseen here; then only the
    # node's last-seen and the metrics of the GPUs (one executemany; on PostgreSQL one statement over arrays).
    statements = written(queries)
    assert statements == fast_path_writes(gpus=2), statements


def test_a_report_of_recorded_inventory_is_read_for_its_metrics_alone(node_a):
    backend, node, client = node_a
    first = vouched(report_of(backend))
    client.post(REPORT, first.to_dict(), format="json")  # inventory the server has not seen: read whole
    assert Node.objects.get(pk=node.pk).agent_report_hash == first.inventory_digest
    backend.sim.start_process(1, used_mib=4096)
    body = vouched(report_of(backend)).to_dict()
    # The digest vouches for the inventory, sent and validated before (a credential speaks for its node only).
    body["driver_version"] = "999.0"
    assert client.post(REPORT, body, format="json").json() == {"desired_config_id": None}
    assert Node.objects.get(pk=node.pk).driver_version == first.driver_version
    assert Gpu.objects.get(node=node, index=1).processes[0]["used_memory_mib"] == 4096
    # The metrics it reads are validated like any report's.
    body["gpus"][0]["utilization_pct"] = "high"
    answer = client.post(REPORT, body, format="json")
    assert answer.status_code == 400 and list(answer.json()["errors"]) == ["gpus[0].utilization_pct"]


def test_a_report_with_a_digest_the_server_has_not_recorded_or_with_events_is_read_whole(node_a):
    backend, node, client = node_a
    client.post(REPORT, vouched(report_of(backend)).to_dict(), format="json")
    upgraded = vouched(dataclasses.replace(report_of(backend), driver_version="999.0"))
    client.post(REPORT, upgraded.to_dict(), format="json")
    assert Node.objects.get(pk=node.pk).driver_version == "999.0"
    uuid = backend.snapshot().gpus[0].uuid
    with_xid = vouched(dataclasses.replace(upgraded, xid_events=(XidEvent(uuid, 79, "2026-11-22T01:00:00Z"),)))
    assert with_xid.inventory_digest == upgraded.inventory_digest  # events are no inventory, but are read
    client.post(REPORT, with_xid.to_dict(), format="json")
    assert list(GpuEvent.objects.values_list("code", flat=True)) == [79]


@pytest.mark.parametrize(
    ("name", "value"), [("utilization_pct", 150.0), ("ecc_sbe_total", -1), ("memory_used_mib", 2**40)]
)
def test_metrics_the_database_cannot_hold_are_refused_by_field_on_either_path(node_a, name, value):
    backend, node, client = node_a
    client.post(REPORT, vouched(report_of(backend)).to_dict(), format="json")
    seen = Node.objects.get(pk=node.pk).agent_last_seen_at
    for body in (vouched(report_of(backend)).to_dict(), report_of(backend).to_dict()):  # metrics alone; read whole
        body["gpus"][1][name] = value
        answer = client.post(REPORT, body, format="json")
        assert answer.status_code == 400, answer.content
        (problem,) = answer.json()["errors"][f"gpus[1].{name}"]
        assert problem.startswith("must be from 0 to ") and problem.endswith(f", not {value!r}")
    assert Node.objects.get(pk=node.pk).agent_last_seen_at == seen


def test_a_report_read_for_its_metrics_must_still_carry_every_field_of_a_report(node_a):
    backend, node, client = node_a
    client.post(REPORT, vouched(report_of(backend)).to_dict(), format="json")
    body = vouched(report_of(backend)).to_dict()
    del body["driver_version"]
    answer = client.post(REPORT, body, format="json")
    assert answer.status_code == 400 and answer.json()["errors"] == {"driver_version": ["is required"]}


def test_a_failing_flush_writes_each_nodes_reports_on_their_own(node_a, join_token, backends, settings):
    backend, node, client = node_a
    other = backends(seed=2)
    answer = register(join_token, other.snapshot().hostname).json()
    other_node, other_client = Node.objects.get(pk=answer["node_id"]), agent_client(answer["credential"])
    for agent, body in ((client, report_of(backend)), (other_client, report_of(other))):
        agent.post(REPORT, body.to_dict(), format="json")  # new inventory: written at once
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 60}
    seen = dict(Node.objects.filter(pk__in=[node.pk, other_node.pk]).values_list("pk", "agent_last_seen_at"))
    for agent, body in ((client, report_of(backend)), (other_client, report_of(other))):
        assert agent.post(REPORT, body.to_dict(), format="json").status_code == 200
    # A row the database refuses (past the checks of the report path): only its own node's writes are lost.
    metric_rows, _ = report_buffer.pending[node.pk]
    metric_rows[0] = (150.0, *metric_rows[0][1:])  # utilization_pct, the first column set
    assert report_buffer.flush() == 1
    after = dict(Node.objects.filter(pk__in=[node.pk, other_node.pk]).values_list("pk", "agent_last_seen_at"))
    assert after[node.pk] == seen[node.pk] and after[other_node.pk] > seen[other_node.pk]


def test_unchanged_reports_are_written_by_the_next_flush_when_buffered(node_a, settings):
    backend, node, client = node_a
    client.post(REPORT, report_of(backend).to_dict(), format="json")  # new inventory: written at once
    seen = Node.objects.get(pk=node.pk).agent_last_seen_at
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 60}
    backend.sim.start_process(1, used_mib=4096)
    with CaptureQueriesContext(connection) as queries:
        assert client.post(REPORT, report_of(backend).to_dict(), format="json").status_code == 200
    assert not any(q["sql"].startswith("UPDATE") for q in queries)
    assert Node.objects.get(pk=node.pk).agent_last_seen_at == seen
    assert report_buffer.flush() == 1
    assert Node.objects.get(pk=node.pk).agent_last_seen_at > seen
    assert Gpu.objects.get(node=node, index=1).processes[0]["used_memory_mib"] == 4096
    # An older buffered write never overwrites a newer one.
    later = Node.objects.get(pk=node.pk).agent_last_seen_at
    at = connection.ops.adapt_datetimefield_value(seen)
    report_buffer.add(node.pk, [], [at, at, "0.0.9", node.pk, at])
    report_buffer.flush()
    assert Node.objects.get(pk=node.pk).agent_last_seen_at == later


def test_a_flush_never_moves_metrics_back_and_keeps_counters_it_could_not_read(node_a):
    """The flush's guards, row by row (SQLite) or over arrays (PostgreSQL): an older buffered row loses to a newer
    one, and an ECC counter NVML could not read (null) keeps its last value."""
    backend, node, client = node_a
    client.post(REPORT, report_of(backend).to_dict(), format="json")
    gpu = Gpu.objects.get(node=node, index=0)
    no_processes = connection.ops.adapt_json_value([], None)

    def flush(utilization, sbe, dbe, at):
        at = connection.ops.adapt_datetimefield_value(at)
        metrics = (utilization, 1024, 50.0, 300.0, no_processes, at, sbe, dbe, node.pk, gpu.uuid, at)
        report_buffer.add(node.pk, [metrics], [at, at, "1.0.0", node.pk, at])
        assert report_buffer.flush() == 1
        gpu.refresh_from_db()
        return gpu.utilization_pct, gpu.ecc_sbe_total, gpu.ecc_dbe_total

    later = gpu.metrics_at + timedelta(seconds=30)
    assert flush(11.0, 5, 2, later) == (11.0, 5, 2)
    assert flush(12.0, None, None, later + timedelta(seconds=15)) == (12.0, 5, 2)
    assert flush(99.0, 9, 9, later - timedelta(seconds=60)) == (12.0, 5, 2)


def _mig(devices, name="layout"):
    from tests.agent.conftest import mig_settings

    return mig_settings(devices, name)


def test_report_records_mig_devices_with_placements_and_users(node_a):
    backend, node, client = node_a
    backend.apply_mig(backend.plan_mig(_mig({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1})))
    snapshot = backend.snapshot()
    pid = backend.sim.start_process(1, used_mib=500, gpu_instance_id=snapshot.gpus[1].mig_devices[0].gpu_instance_id)
    report = report_of(backend)
    client.post(REPORT, report.to_dict(), format="json")
    node.refresh_from_db()
    assert node.observed_mode == "mig"
    assert node.allocatable == {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-3g.40gb": 2}
    for gpu in report.gpus:
        stored = list(MigDevice.objects.filter(gpu__uuid=gpu.uuid).order_by("start"))
        reported = sorted(gpu.mig_devices, key=lambda d: d.start)
        assert [(m.profile, m.start, m.size, m.uuid) for m in stored] == [
            (d.profile, d.start, d.size, d.uuid) for d in reported
        ]
        assert Gpu.objects.get(uuid=gpu.uuid).mig_enabled
    used = MigDevice.objects.get(
        gpu__uuid=report.gpus[1].uuid, gpu_instance_id=snapshot.gpus[1].mig_devices[0].gpu_instance_id
    )
    assert used.in_use_by == f"pid {pid}"
    assert MigDevice.objects.exclude(in_use_by="").count() == 1


def test_pending_mig_mode_is_recorded(node_a):
    backend, node, client = node_a
    gpus = report_of(backend).gpus
    pending = (dataclasses.replace(gpus[0], mig_mode_pending=True), gpus[1])
    client.post(REPORT, report_of(backend, gpus=pending).to_dict(), format="json")
    assert Gpu.objects.get(uuid=gpus[0].uuid).mig_pending is True
    assert Gpu.objects.get(uuid=gpus[1].uuid).mig_pending is None


def test_xid_and_ecc_events_are_recorded_once(node_a):
    backend, node, client = node_a
    gpu = report_of(backend).gpus[0]
    xid = XidEvent(gpu.uuid, 79, "2026-11-22T01:02:03.456789Z")
    client.post(REPORT, report_of(backend, xids=[xid]).to_dict(), format="json")
    client.post(REPORT, report_of(backend, xids=[xid]).to_dict(), format="json")  # the agent re-sent it
    stored = Gpu.objects.get(uuid=gpu.uuid)
    (event,) = gpu_events(stored)
    assert (event.kind, event.code) == ("xid", 79) and "fallen off the bus" in event.message
    assert stored.last_xid == 79 and stored.health == "unhealthy"
    backend.sim.add_ecc_errors(1, uncorrected=2)
    client.post(REPORT, report_of(backend).to_dict(), format="json")
    client.post(REPORT, report_of(backend).to_dict(), format="json")
    other = Gpu.objects.get(node=node, index=1)
    (ecc,) = gpu_events(other)
    assert (ecc.kind, ecc.code) == ("ecc", 2) and "2 new uncorrectable" in ecc.message
    assert other.ecc_dbe_total == 2 and other.health == "unhealthy"
    assert GpuEvent.objects.count() == 2


def test_report_validation_uses_the_error_shape(node_a):
    backend, _, client = node_a
    body = report_of(backend).to_dict()
    del body["gpus"][0]["uuid"]
    answer = client.post(REPORT, body, format="json")
    assert answer.status_code == 400
    assert answer.json() == {
        "message": "Invalid input: gpus[0].uuid: is required",
        "errors": {"gpus[0].uuid": ["is required"]},
    }


# --- a credential acts on its own node only -----------------------------------------------------------------------


def test_a_credential_reports_for_its_own_node_only(node_a, join_token, backends):
    backend_a, node_a_row, client_a = node_a
    backend_b = backends(seed=2)
    answer_b = register(join_token, backend_b.snapshot().hostname).json()
    client_b = agent_client(answer_b["credential"])
    node_b = Node.objects.get(pk=answer_b["node_id"])
    client_b.post(REPORT, report_of(backend_b).to_dict(), format="json")
    before_b = _rows(node_b)
    # A's credential cannot report B's inventory: the report names B.
    stolen = client_a.post(REPORT, report_of(backend_b).to_dict(), format="json")
    assert stolen.status_code == 403 and node_a_row.name in stolen.json()["message"]
    # A's own report, with an XID for one of B's GPUs smuggled in, changes A only.
    foreign = XidEvent(report_of(backend_b).gpus[0].uuid, 48, "2026-11-22T01:00:00Z")
    assert client_a.post(REPORT, report_of(backend_a, xids=[foreign]).to_dict(), format="json").status_code == 200
    assert _rows(node_b) == before_b
    assert Gpu.objects.filter(node=node_a_row).count() == 2 and not GpuEvent.objects.exists()


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/nodes/"),
        ("get", "/api/v1/gpus/"),
        ("get", "/api/v1/me/"),
        ("get", "/api/v1/agent-credentials/"),
        ("post", "/api/v1/clusters/"),
        ("post", "/api/v1/agent-join-tokens/"),
    ],
)
def test_node_credentials_are_refused_by_the_user_api(node_a, method, url):
    _, node, client = node_a
    answer = getattr(client, method)(url, {}, format="json")
    assert answer.status_code in (401, 403)
    node_revoke = client.post(f"/api/v1/nodes/{node.pk}/revoke-agent/")
    assert node_revoke.status_code in (401, 403)


def test_user_sessions_and_tokens_are_refused_by_agent_endpoints(node_a, admin_user):
    backend, _, _ = node_a
    body = report_of(backend, hostname=node_a[1].name).to_dict()
    session = Client()
    session.force_login(admin_user)
    _, token = api_token_rotate(user=admin_user)
    with_token = APIClient()
    with_token.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    bearer_user_token = agent_client(token)
    for client in (session, with_token, bearer_user_token, APIClient()):
        assert client.post(REPORT, body, content_type="application/json").status_code == 401
        assert client.get(DESIRED).status_code == 401
        assert client.post(OUTCOME, {}, content_type="application/json").status_code == 401


def test_revoked_credentials_get_401_with_the_message(node_a, admin_api):
    backend, node, client = node_a
    revoked = admin_api.post(f"/api/v1/nodes/{node.pk}/revoke-agent/")
    assert revoked.status_code == 200 and revoked.json()["active"] is False
    assert AuditEvent.objects.filter(action="node.agent_revoke", object_id=str(node.pk)).exists()
    answer = client.post(REPORT, report_of(backend).to_dict(), format="json")
    assert answer.status_code == 401
    assert answer.json()["message"].lower().rstrip(".") == "agent credential revoked or unknown"
    assert answer["WWW-Authenticate"].startswith("Bearer")
    credential = AgentCredential.objects.get(node=node)
    assert admin_api.post(f"/api/v1/agent-credentials/{credential.pk}/revoke/").status_code == 409
    assert admin_api.post(f"/api/v1/nodes/{node.pk}/revoke-agent/").status_code == 409


def test_agent_endpoints_are_throttled(node_a, monkeypatch):
    assert AgentReportView.throttle_classes == [AgentRateThrottle] and AgentRateThrottle.scope == "agent"
    assert AgentRegisterView.throttle_classes == [AgentRegisterThrottle] and AgentRegisterThrottle.scope == "agent"
    backend, _, client = node_a
    monkeypatch.setattr(AgentRateThrottle, "THROTTLE_RATES", {"agent": "2/min"})
    body = report_of(backend).to_dict()
    assert [client.post(REPORT, body, format="json").status_code for _ in range(3)] == [200, 200, 429]
    monkeypatch.setattr(AgentRegisterThrottle, "THROTTLE_RATES", {"agent": "1/min"})
    clear_throttle_counts()  # node_a's registration counted already
    assert [register("x", "n").status_code for _ in range(2)] == [403, 429]


# --- desired configs and outcomes ----------------------------------------------------------------------------------


def test_desired_config_of_a_change(rollout_on_a):
    backend, node, client, change = rollout_on_a
    config_id = change.to_config["config_id"]
    assert client.post(REPORT, report_of(backend).to_dict(), format="json").json() == {"desired_config_id": config_id}
    desired = DesiredConfig.from_dict(client.get(DESIRED).json())
    assert (desired.config_id, desired.change_id) == (config_id, change.pk)
    assert desired.mig.selected == change.applied_mig_config == change.to_config["mig_config"]
    assert desired.mig.mig_parted_config == change.to_config["mig_parted"]
    assert (desired.mps, desired.time_slice, desired.persistence_mode) == (None, None, None)
    assert (desired.safety.busy_policy, desired.safety.wait_seconds) == ("wait", 30 * 60)


def test_desired_config_carries_node_settings_and_sharing_of_the_change(rollout_on_a):
    backend, node, client, change = rollout_on_a
    settings = {"gpu": {"persistence_mode": True}, "host": {"swappiness": 10}}
    sharing = {**change.to_config["sharing"], "mode": "mps", "replicas": 4, "mps_active_thread_percentage": 25}
    NodeChange.objects.filter(pk=change.pk).update(to_config={**change.to_config, "node_settings": settings,
                                                              "sharing": sharing})  # fmt: skip
    desired = DesiredConfig.from_dict(client.get(DESIRED).json())
    assert desired.node_settings.to_dict() == settings
    assert desired.mps == MpsSettings(replicas=4, default_active_thread_percentage=25)
    Rollout.objects.update(busy_policy="force")
    assert client.get(DESIRED).json()["safety"] == {"busy_policy": "force", "wait_seconds": 1800}
    # A retry under a new name (the engine's wedged-pending path): the same layout, renamed, selected by that name.
    retry_name = change.to_config["mig_config"] + "-r1"
    NodeChange.objects.filter(pk=change.pk).update(applied_mig_config=retry_name)
    mig = DesiredConfig.from_dict(client.get(DESIRED).json()).mig
    assert mig.selected == retry_name
    assert (
        f"\n  {retry_name}:" in mig.mig_parted_config
        and change.to_config["mig_config"] + ":" not in mig.mig_parted_config
    )


def _apply(backend, desired: DesiredConfig) -> AppliedState:
    backend.apply_mig(backend.plan_mig(desired.mig))
    return AppliedState(config_id=desired.config_id, mig_selected=desired.mig.selected)


def test_succeeded_outcome_lets_the_engine_verify(rollout_on_a, django_capture_on_commit_callbacks):
    backend, node, client, change = rollout_on_a
    desired = DesiredConfig.from_dict(client.get(DESIRED).json())
    applied = _apply(backend, desired)
    outcome = Outcome(
        change.pk, desired.config_id, "succeeded", "MIG config applied", report_of(backend, applied=applied)
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(OUTCOME, outcome.to_dict(), format="json").status_code == 200
    change.refresh_from_db()
    node.refresh_from_db()
    assert change.status == ChangeStatus.SUCCEEDED, change.error
    assert Rollout.objects.get().status == "succeeded"
    assert node.observed_mig_config == change.applied_mig_config and node.config_state == "success"
    assert node.observed_device_plugin_config == change.to_config["device_plugin_config"]
    assert node.allocatable == change.to_config["allocatable"] == {"nvidia.com/mig-3g.40gb": 4}
    assert MigDevice.objects.filter(gpu__node=node, profile="3g.40gb").count() == 4
    # A repeated outcome is accepted and changes nothing; the node is in sync, nothing to do.
    before = _rows(node)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(OUTCOME, outcome.to_dict(), format="json").status_code == 200
    assert _rows(node) == before
    assert client.post(REPORT, report_of(backend, applied=applied).to_dict(), format="json").json() == {
        "desired_config_id": None
    }
    assert DesiredConfig.from_dict(client.get(DESIRED).json()).change_id is None
    assert reconcile.reconcile() == []


def test_failed_outcome_fails_the_change_and_rolls_back(rollout_on_a, django_capture_on_commit_callbacks):
    backend, node, client, change = rollout_on_a
    outcome = Outcome(change.pk, change.to_config["config_id"], "failed", "GPU 1: reset failed", report_of(backend))
    with django_capture_on_commit_callbacks(execute=True):
        client.post(OUTCOME, outcome.to_dict(), format="json")
    change.refresh_from_db()
    node.refresh_from_db()
    assert (node.config_state, node.last_error) == ("failed", "GPU 1: reset failed")
    assert change.status in (ChangeStatus.FAILED, ChangeStatus.ROLLED_BACK)
    assert "GPU 1: reset failed" in change.error
    client.post(REPORT, report_of(backend).to_dict(), format="json")  # the failure stands until something new applies
    node.refresh_from_db()
    assert node.config_state == "failed"


def _roll_out_and_apply(client, backend) -> NodeChange:
    """Plan, start and step the rollout of node A's pool; return its change, verifying (the agent's turn)."""
    (rollout_id,) = reconcile.reconcile()
    change_ids = worker_services.rollout_advance(rollout_id)
    worker_services.node_changes_step(change_ids)
    return NodeChange.objects.get(pk=change_ids[0])


def _applied(change: NodeChange) -> AppliedState:
    """What the agent reports once it applied the change."""
    settings = change.to_config.get("node_settings")
    return AppliedState(
        change.to_config["config_id"],
        mig_selected=change.applied_mig_config,
        node_settings=NodeSettings.from_dict(settings) if settings else None,
    )


@pytest.fixture
def qos_rollout_on_a(node_a, admin_user):
    """Node A runs whole GPUs (applied and verified), then its pool gets a QoS policy: the new change moves no
    label, no MIG config and no GPU resource, only what the agent applies."""
    backend, node, client = node_a
    client.post(REPORT, report_of(backend).to_dict(), format="json")
    pool = NodePoolFactory(cluster=node.cluster)
    Node.objects.filter(pk=node.pk).update(pool=pool)
    actor = Actor.for_user(admin_user)
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=whole)
    first = _roll_out_and_apply(client, backend)
    client.post(REPORT, report_of(backend, applied=_applied(first)).to_dict(), format="json")
    worker_services.node_changes_step([first.pk])
    assert NodeChange.objects.get(pk=first.pk).status == ChangeStatus.SUCCEEDED
    policy = sharing_services.qos_policy_create(actor=actor, name="training", transparent_hugepages="always")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    return backend, node, client, _roll_out_and_apply(client, backend)


def test_a_qos_only_change_is_verified_only_once_the_agent_names_its_config(qos_rollout_on_a):
    backend, node, client, change = qos_rollout_on_a
    assert change.to_config["node_settings"] == {"gpu": {}, "host": {"transparent_hugepages": "always"}}
    # Labels, MIG config and resources already look as wanted; the agent has not applied the settings yet.
    worker_services.node_changes_step([change.pk])
    change.refresh_from_db()
    assert change.status == ChangeStatus.VERIFYING
    client.post(REPORT, report_of(backend, applied=_applied(change)).to_dict(), format="json")
    worker_services.node_changes_step([change.pk])
    change.refresh_from_db()
    assert change.status == ChangeStatus.SUCCEEDED


def test_a_failed_outcome_of_a_change_without_mig_fails_it_at_once(
    qos_rollout_on_a, django_capture_on_commit_callbacks
):
    backend, node, client, change = qos_rollout_on_a
    config_id = change.to_config["config_id"]
    outcome = Outcome(change.pk, config_id, "failed", "writing THP: permission denied", report_of(backend))
    with django_capture_on_commit_callbacks(execute=True):
        client.post(OUTCOME, outcome.to_dict(), format="json")
    change.refresh_from_db()
    assert change.status in (ChangeStatus.FAILED, ChangeStatus.ROLLED_BACK)  # long before the verify deadline
    assert change.error.startswith("the agent reported failure: writing THP: permission denied")


@pytest.mark.parametrize(("policy", "expected"), [("wait", ChangeStatus.FAILED), ("skip", ChangeStatus.SKIPPED)])
def test_refused_busy_goes_back_to_the_busy_policy(rollout_on_a, policy, expected, django_capture_on_commit_callbacks):
    backend, node, client, change = rollout_on_a
    Rollout.objects.update(busy_policy=policy)
    pid = backend.sim.start_process(0)
    outcome = Outcome(
        change.pk, change.to_config["config_id"], "refused_busy", "compute processes hold GPU 0", report_of(backend)
    )
    with django_capture_on_commit_callbacks(execute=True):
        client.post(OUTCOME, outcome.to_dict(), format="json")
    change.refresh_from_db()
    assert change.status == expected
    assert f"pid {pid} on GPU 0" in change.error
    assert AuditEvent.objects.filter(action="change.waiting_for_idle", object_id=str(change.pk)).count() == 2


def test_outcome_for_another_nodes_change_is_refused(rollout_on_a, join_token, backends):
    backend, node, client, change = rollout_on_a
    other = backends(seed=5)
    answer = register(join_token, other.snapshot().hostname).json()
    outcome = Outcome(change.pk, change.to_config["config_id"], "failed", "not mine", report_of(other))
    refused = agent_client(answer["credential"]).post(OUTCOME, outcome.to_dict(), format="json")
    assert refused.status_code == 403 and f"Change {change.pk} is not one of node" in refused.json()["message"]
    assert not Node.objects.get(name=other.snapshot().hostname).gpus.exists()  # nothing of its report stored
    change.refresh_from_db()
    assert change.status == ChangeStatus.VERIFYING
    assert Node.objects.get(pk=node.pk).config_state != "failed"


def test_desired_without_anything_to_do_is_404(node_a):
    _, _, client = node_a
    answer = client.get(DESIRED)
    assert answer.status_code == 404 and answer.json()["message"].startswith("Nothing to apply")


# --- pieces --------------------------------------------------------------------------------------------------------


def test_observed_allocatable_follows_what_the_node_runs(backends):
    gpus = report_of(backends()).gpus
    assert observed_allocatable(gpus, None, None) == {"nvidia.com/gpu": 2}
    mps = AppliedState("c", mps=MpsSettings(replicas=4))
    assert observed_allocatable(gpus, mps, None) == {"nvidia.com/gpu": 8}
    sliced = AppliedState("c", time_slice=TimeSliceSettings("short"))
    plugin = DevicePluginSpec(sharing="time_slicing", replicas=3, rename_by_default=True)
    assert observed_allocatable(gpus, sliced, plugin) == {"nvidia.com/gpu.shared": 6}
    # The plugin says time-slicing, but the node does not run it: whole GPUs.
    assert observed_allocatable(gpus, AppliedState("c"), plugin) == {"nvidia.com/gpu": 2}


def test_agent_nodes_are_stale_after_three_missed_reports(settings):
    settings.TESSERA = {**settings.TESSERA, "AGENT_INTERVAL_SECONDS": 10}
    agent_cluster = ClusterFactory(driver="agent", kubeconfig_path="")
    now = timezone.now()
    late = NodeFactory(cluster=agent_cluster, last_seen_at=now - timedelta(seconds=31))
    on_time = NodeFactory(cluster=agent_cluster, last_seen_at=now - timedelta(seconds=29))
    kubernetes = NodeFactory(last_seen_at=now - timedelta(seconds=31))
    never = NodeFactory(cluster=agent_cluster, last_seen_at=None)
    assert set(Node.objects.stale(now)) == {late, never}
    assert set(Node.objects.fresh(now)) == {on_time, kubernetes}


def test_the_compiled_decoder_reads_like_the_protocol(backends):
    backend = backends()
    pid = backend.sim.start_process(0)
    body = report_of(
        backend,
        xids=[XidEvent(report_of(backend).gpus[0].uuid, 79, "2026-11-22T01:00:00Z", gpu_instance_id=1)],
        applied=AppliedState("c", mps=MpsSettings(replicas=2), time_slice=None),
    ).to_dict()
    assert protocol_decode(Report, body) == Report.from_dict(body)
    assert protocol_decode(Report, body).gpus[0].processes[0].pid == pid
    body["gpus"][0]["utilization_pct"] = 50  # an int where a float goes: accepted as float, as the protocol does
    assert protocol_decode(Report, body).gpus[0].utilization_pct == 50.0
    broken = [
        ("gpus", "x"),
        ("numa_nodes", "2"),
        ("applied", {"config_id": 7}),
        ("xid_events", [{"gpu_uuid": "g", "xid": True, "at": "t"}]),
        ("host", None),
        ("gpus", [{**body["gpus"][0], "compute_mode": "fast"}]),
    ]
    for key, value in broken:
        wrong = {**body, key: value}
        with pytest.raises(protocol.ProtocolError) as expected:
            Report.from_dict(wrong)
        with pytest.raises(protocol.ProtocolError) as got:
            protocol_decode(Report, wrong)
        assert str(got.value) == str(expected.value)
    del body["hostname"]
    with pytest.raises(protocol.ProtocolError, match=r"^Report\.hostname is required$"):
        protocol_decode(Report, body)


def test_serializers_mirror_the_protocol():
    for name, serializer_class in PROTOCOL_MIRRORS.items():
        message = getattr(protocol, name)
        fields = serializer_class().fields
        assert list(fields) == [f.name for f in dataclasses.fields(message)], name
        hints = typing.get_type_hints(message)
        for f in dataclasses.fields(message):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            assert fields[f.name].required == required, f"{name}.{f.name}"
            nullable = type(None) in typing.get_args(hints[f.name])
            assert fields[f.name].allow_null == nullable, f"{name}.{f.name}"


def test_openapi_schema_documents_the_agent_endpoints():
    GENERATOR_STATS.reset()
    schema = SchemaGenerator(patterns=[path("api/v1/", include("agents.api.urls"))]).get_schema(
        request=None, public=True
    )
    assert not GENERATOR_STATS, "drf-spectacular warned about an agent endpoint"
    paths = schema["paths"]
    assert {
        "/api/v1/agent/register/",
        "/api/v1/agent/report/",
        "/api/v1/agent/desired/",
        "/api/v1/agent/outcome/",
    } <= set(paths)
    assert paths["/api/v1/agent/report/"]["post"]["security"] == [{"agentCredential": []}]
    assert "security" not in paths["/api/v1/agent/register/"]["post"] or paths["/api/v1/agent/register/"]["post"][
        "security"
    ] in ([], [{}])
    assert schema["components"]["securitySchemes"]["agentCredential"]["scheme"] == "bearer"
    report = schema["components"]["schemas"]["AgentReportRequest"]
    assert set(report["required"]) == {
        f.name
        for f in dataclasses.fields(Report)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    assert "inventory_digest" in report["properties"]
