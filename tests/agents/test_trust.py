"""Issue 15's attacks on the agent boundary, each tried against the real API: a node speaks only for itself (no
GPU or MIG UUID of another live node, no re-registering another node with a join token alone) and the register
throttle counts the real client address, not a header the client writes."""

import dataclasses

import pytest
from django.forms.models import model_to_dict
from django.urls import reverse

from agent import protocol
from agent.protocol import MigSettings, Outcome
from agents import reports
from agents.authentication import AgentRegisterThrottle
from core.models import AuditEvent
from fleet.models import Gpu, MigDevice, Node, UuidConflict
from sharing.render import MigDeviceSpec, render_mig_parted_config
from tests.agents.conftest import agent_client, register, report_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_throttle_counts_and_writes_at_once")]
REPORT, OUTCOME = protocol.REPORT_PATH, protocol.OUTCOME_PATH


@pytest.fixture
def node_b(join_token, backends):
    """A second registered node, not reported yet: (backend, node, agent client)."""
    backend = backends(seed=2)
    answer = register(join_token, "gpu-b").json()
    return backend, Node.objects.get(pk=answer["node_id"]), agent_client(answer["credential"])


def _gpu_rows(node) -> list[dict]:
    return [model_to_dict(g, exclude=["updated_at"]) for g in Gpu.objects.filter(node=node).order_by("uuid")]


def _post(client, report):
    return client.post(REPORT, report.to_dict(), format="json")


def _with_mig(backend, devices=None):
    spec = MigDeviceSpec("all", True, devices or {"3g.40gb": 1, "2g.20gb": 1})
    backend.apply_mig(backend.plan_mig(MigSettings(render_mig_parted_config({"layout": [spec]}), "layout")))


# --- a node reports its own GPUs only -----------------------------------------------------------------------------


def test_a_report_naming_another_live_nodes_gpu_is_refused_audited_and_shown_on_both(node_a, node_b, client, viewer):
    backend_a, a, client_a = node_a
    _, b, client_b = node_b
    assert _post(client_a, report_of(backend_a)).status_code == 200
    before = _gpu_rows(a)
    stolen_uuid = report_of(backend_a).gpus[0].uuid
    # B's agent reports A's GPUs as its own (a copied state, or a credential misused): refused, every time.
    for _ in range(2):
        refused = _post(client_b, report_of(backend_a, hostname="gpu-b"))
        assert refused.status_code == 409
        assert stolen_uuid in refused.json()["message"] and a.name in refused.json()["message"]
        assert any(a.name in error for error in refused.json()["errors"]["gpus"])
    assert _gpu_rows(a) == before and not Gpu.objects.filter(node=b).exists()
    conflicts = UuidConflict.objects.filter(node=b, holder=a, resolved_at__isnull=True)
    assert conflicts.count() == 2 and {c.reports for c in conflicts} == {2}
    assert AuditEvent.objects.filter(action="node.uuid_conflict", object_id=str(b.pk)).count() == 1
    assert AuditEvent.objects.filter(action="node.uuid_claimed", object_id=str(a.pk)).count() == 1
    client.force_login(viewer)
    for node in (a, b):
        page = client.get(reverse("console:node_detail", args=[node.pk])).content.decode()
        assert 'id="uuid-conflicts"' in page and stolen_uuid in page


def test_an_outcome_naming_another_nodes_gpu_is_refused_too(node_a, node_b):
    backend_a, a, client_a = node_a
    _, b, client_b = node_b
    assert _post(client_a, report_of(backend_a)).status_code == 200
    outcome = Outcome(None, "cfg", "succeeded", "", report_of(backend_a, hostname="gpu-b"))
    refused = client_b.post(OUTCOME, outcome.to_dict(), format="json")
    assert refused.status_code == 409 and UuidConflict.objects.filter(node=b, holder=a).count() == 2
    assert Gpu.objects.filter(node=a).count() == 2 and not Gpu.objects.filter(node=b).exists()


def test_two_agents_reporting_the_same_mig_uuid_get_a_409_not_a_500(node_a, node_b):
    backend_a, a, client_a = node_a
    backend_b, b, client_b = node_b
    _with_mig(backend_a)
    assert _post(client_a, report_of(backend_a)).status_code == 200
    stolen = report_of(backend_a).gpus[0].mig_devices[0]
    _with_mig(backend_b)
    own = report_of(backend_b)
    gpu = dataclasses.replace(own.gpus[0], mig_devices=(stolen, *own.gpus[0].mig_devices[1:]))
    refused = _post(client_b, dataclasses.replace(own, gpus=(gpu, *own.gpus[1:]), hostname="gpu-b"))
    assert refused.status_code == 409 and stolen.uuid in refused.json()["message"]
    assert MigDevice.objects.get(uuid=stolen.uuid).gpu.node == a
    assert UuidConflict.objects.get(node=b).kind == "mig"


@pytest.mark.parametrize("kind", ["gpu", "mig"])
def test_a_uuid_taken_by_another_node_past_the_check_is_a_409_not_a_500(node_a, node_b, monkeypatch, kind):
    backend_a, a, client_a = node_a
    backend_b, b, client_b = node_b
    if kind == "mig":
        _with_mig(backend_a)
        _with_mig(backend_b)
    assert _post(client_a, report_of(backend_a)).status_code == 200
    real, calls = reports.refuse_foreign_uuids, []

    def first_check_misses(**kwargs):
        calls.append(kwargs)
        if len(calls) > 1:
            real(**kwargs)

    # As if A's report stored its GPU between B's check and B's write: the unique UUID refuses B's row, never moves A's.
    monkeypatch.setattr(reports, "refuse_foreign_uuids", first_check_misses)
    own = report_of(backend_b, hostname="gpu-b")
    stolen = report_of(backend_a).gpus[0]
    if kind == "mig":
        stolen = dataclasses.replace(own.gpus[0], mig_devices=stolen.mig_devices)
    refused = _post(client_b, dataclasses.replace(own, gpus=(stolen, *own.gpus[1:])))
    assert refused.status_code == 409 and len(calls) == 2
    assert Gpu.objects.filter(node=a).count() == 2 and not Gpu.objects.filter(node=b).exists()
    assert MigDevice.objects.filter(gpu__node=a).count() == (4 if kind == "mig" else 0)


def test_a_gpu_that_moved_is_accepted_once_its_former_node_no_longer_reports_it(node_a, node_b):
    backend_a, a, client_a = node_a
    _, b, client_b = node_b
    assert _post(client_a, report_of(backend_a)).status_code == 200
    moved = report_of(backend_a).gpus[0]
    assert _post(client_b, report_of(backend_a, hostname="gpu-b", gpus=(moved,))).status_code == 409
    # A reports without it: the GPU is gone from A, so B may report it (with its history).
    assert _post(client_a, report_of(backend_a, gpus=report_of(backend_a).gpus[1:])).status_code == 200
    assert _post(client_b, report_of(backend_a, hostname="gpu-b", gpus=(moved,))).status_code == 200
    gpu = Gpu.objects.get(uuid=moved.uuid)
    assert gpu.node == b and gpu.gone_at is None
    assert not UuidConflict.objects.filter(resolved_at__isnull=True).exists()


def test_a_uuid_twice_in_one_report_is_a_400(node_a):
    backend, _, client = node_a
    report = report_of(backend)
    twice = dataclasses.replace(report.gpus[1], uuid=report.gpus[0].uuid)
    refused = _post(client, dataclasses.replace(report, gpus=(report.gpus[0], twice)))
    assert refused.status_code == 400 and "appears twice" in refused.json()["errors"]["gpus"][0]


# --- the register throttle keys on the real client address -------------------------------------------------------


def test_a_forged_x_forwarded_for_does_not_reset_the_register_throttle(cluster, monkeypatch):
    monkeypatch.setattr(AgentRegisterThrottle, "THROTTLE_RATES", {"agent": "2/min"})
    codes = [register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR=f"10.9.0.{i}").status_code for i in range(4)]
    assert codes == [403, 403, 429, 429]


def test_behind_trusted_proxies_the_address_they_vouch_for_is_counted(cluster, monkeypatch, settings):
    settings.TESSERA = {**settings.TESSERA, "TRUSTED_PROXY_COUNT": 1}
    monkeypatch.setattr(AgentRegisterThrottle, "THROTTLE_RATES", {"agent": "1/min"})
    # The proxy appends the address it was connected from; what the client wrote before it does not count.
    first = register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR="1.1.1.1, 198.51.100.7").status_code
    forged = register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR="2.2.2.2, 198.51.100.7").status_code
    other = register("tsj_guess_x", "n", HTTP_X_FORWARDED_FOR="198.51.100.8").status_code
    assert (first, forged, other) == (403, 429, 403)
