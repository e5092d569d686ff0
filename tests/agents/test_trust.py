"""Issue 15's attacks on the agent boundary, each tried against the real API: a node speaks only for itself (no
GPU or MIG UUID of another live node, no re-registering another node with a join token alone) and the register
throttle counts the real client address, not a header the client writes."""

import dataclasses
import json
import ssl
import urllib.request
from datetime import timedelta

import pytest
from django.forms.models import model_to_dict
from django.urls import reverse
from django.utils import timezone

from agent import protocol
from agent.protocol import MigSettings, Outcome
from agents import reports
from agents.authentication import AgentRegisterThrottle
from core.audit import Actor
from core.models import AuditEvent
from fleet import agent_credentials
from fleet.models import AgentCredential, AgentJoinToken, Gpu, MigDevice, Node, PendingAgent, UuidConflict
from sharing.render import MigDeviceSpec, render_mig_parted_config
from tests.agents.conftest import agent_client, register, report_of
from tests.factories import ClusterFactory

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


# --- an admin settles a conflict ------------------------------------------------------------------------------------


def _conflict(node_a, node_b):
    """B reports A's first GPU: refused, one conflict per UUID of the report that A holds."""
    backend_a, a, client_a = node_a
    _, b, client_b = node_b
    assert _post(client_a, report_of(backend_a)).status_code == 200
    moved = report_of(backend_a, hostname="gpu-b", gpus=report_of(backend_a).gpus[:1])
    assert _post(client_b, moved).status_code == 409
    return UuidConflict.objects.get(node=b, holder=a), moved


def test_an_admin_gives_the_uuid_to_the_reporter_through_the_api(node_a, node_b, admin_api, operator_api):
    conflict, moved = _conflict(node_a, node_b)
    _, a, _ = node_a
    _, b, client_b = node_b
    url = f"/api/v1/uuid-conflicts/{conflict.pk}/resolve/"
    assert operator_api.post(url, {"owner": "reporter"}, format="json").status_code == 403
    bad = admin_api.post(url, {"owner": "nobody"}, format="json")
    assert bad.status_code == 400 and "owner" in bad.json()["errors"]
    settled = admin_api.post(url, {"owner": "reporter"}, format="json")
    assert settled.status_code == 200 and settled.json()["resolved_at"]
    assert Gpu.objects.get(uuid=moved.gpus[0].uuid).gone_at is not None
    # The reporter's next report is accepted: the GPU (and its history) moves to it.
    assert _post(client_b, moved).status_code == 200
    assert Gpu.objects.get(uuid=moved.gpus[0].uuid).node == b
    events = AuditEvent.objects.filter(action="node.uuid_conflict_resolved")
    assert {e.object_id for e in events} == {str(a.pk), str(b.pk)} and {e.actor_label for e in events} == {"admin"}
    assert {e.after["owner"] for e in events} == {b.name}
    again = admin_api.post(url, {"owner": "holder"}, format="json")
    assert again.status_code == 409 and again.json()["message"] == "This conflict is resolved already."


def test_an_admin_keeps_the_uuid_with_its_holder_from_the_node_page(node_a, node_b, client, admin_user, operator):
    conflict, moved = _conflict(node_a, node_b)
    _, a, _ = node_a
    _, b, client_b = node_b
    url = reverse("console:uuid_conflict_resolve", args=[conflict.pk])
    client.force_login(operator)
    assert "Keep it on" not in client.get(reverse("console:node_detail", args=[a.pk])).content.decode()
    assert client.post(url, {"owner": "holder"}).status_code == 403
    client.force_login(admin_user)
    page = client.get(reverse("console:node_detail", args=[a.pk])).content.decode()
    assert f'action="{url}"' in page and f"Keep it on {a.name}" in page and f"Give it to {b.name}" in page
    answer = client.post(url, {"owner": "holder", "next_node": a.pk}, follow=True)
    assert answer.redirect_chain[-1][0] == reverse("console:node_detail", args=[a.pk])
    assert f"now belongs to node {a.name}" in answer.content.decode()
    assert 'id="uuid-conflicts"' not in answer.content.decode()
    assert Gpu.objects.get(uuid=moved.gpus[0].uuid).node == a
    assert AuditEvent.objects.filter(action="node.uuid_conflict_resolved", object_id=str(b.pk)).exists()
    # Kept with A: B naming it again is refused again, a new conflict.
    assert _post(client_b, moved).status_code == 409
    assert UuidConflict.objects.filter(node=b, resolved_at__isnull=True).count() == 1


def test_an_admin_gives_a_mig_uuid_to_the_reporter(node_a, node_b, admin_api):
    backend_a, a, client_a = node_a
    backend_b, b, client_b = node_b
    _with_mig(backend_a)
    assert _post(client_a, report_of(backend_a)).status_code == 200
    stolen = report_of(backend_a).gpus[0].mig_devices[0]
    _with_mig(backend_b)
    own = report_of(backend_b)
    gpu = dataclasses.replace(own.gpus[0], mig_devices=(stolen, *own.gpus[0].mig_devices[1:]))
    report = dataclasses.replace(own, gpus=(gpu, *own.gpus[1:]), hostname="gpu-b")
    assert _post(client_b, report).status_code == 409
    conflict = UuidConflict.objects.get(node=b)
    settled = admin_api.post(f"/api/v1/uuid-conflicts/{conflict.pk}/resolve/", {"owner": "reporter"}, format="json")
    assert settled.status_code == 200 and not MigDevice.objects.filter(uuid=stolen.uuid).exists()
    assert _post(client_b, report).status_code == 200
    assert MigDevice.objects.get(uuid=stolen.uuid).gpu.node == b


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


# --- a join token alone never takes over a node that exists --------------------------------------------------------


def _works(client, backend) -> bool:
    return _post(client, report_of(backend)).status_code == 200


def test_a_join_token_and_a_hostname_no_longer_take_over_a_registered_node(node_a, join_token):
    backend, a, client_a = node_a
    # The attacker holds the shared join token and names A: without A's credential or an approval, nothing is issued.
    old_agent = register(join_token, a.name)
    assert old_agent.status_code == 403 and "current credential or an admin's approval" in old_agent.json()["message"]
    asked = register(join_token, a.name, fields={"request_key": "attacker-key"})
    assert asked.status_code == 202 and asked.json()["fingerprint"] == protocol.request_fingerprint("attacker-key")
    assert "credential" not in asked.json()
    forged = register(join_token, a.name, fields={"credential": "tsa_0123456789ab_not-the-secret"})
    assert forged.status_code == 403
    assert _works(client_a, backend) and AgentCredential.objects.filter(node=a, revoked_at__isnull=True).count() == 1
    pending = PendingAgent.objects.get(node=a)
    assert pending.status == "pending" and pending.address == "127.0.0.1"
    assert AuditEvent.objects.filter(action="node.agent_register_pending", object_id=str(a.pk)).count() == 1
    # Asking again with the same key is the same request.
    assert register(join_token, a.name, fields={"request_key": "attacker-key"}).status_code == 202
    assert PendingAgent.objects.count() == 1


def test_an_admin_approves_a_pending_agent_through_the_api_and_it_collects_its_credential_once(
    node_a, join_token, admin_api, operator_api
):
    backend, a, client_a = node_a
    register(join_token, a.name, fields={"request_key": "lost-state-key"})
    (listed,) = admin_api.get("/api/v1/pending-agents/?status=pending").json()["results"]
    assert listed["fingerprint"] == protocol.request_fingerprint("lost-state-key") and listed["node"]["id"] == a.pk
    url = f"/api/v1/pending-agents/{listed['id']}/"
    assert operator_api.get(url).status_code == 403 and operator_api.post(url + "approve/").status_code == 403
    approved = admin_api.post(url + "approve/")
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    assert admin_api.post(url + "reject/").status_code == 409
    assert _works(client_a, backend)  # the old credential works until the approved agent collects its own
    answer = register(join_token, a.name, fields={"request_key": "lost-state-key"})
    assert answer.status_code == 201 and answer.json()["node_id"] == a.pk
    assert _post(client_a, report_of(backend)).status_code == 401
    assert _works(agent_client(answer.json()["credential"]), backend)
    assert register(join_token, a.name, fields={"request_key": "lost-state-key"}).status_code == 403  # used once
    actions = AuditEvent.objects.filter(object_id=str(a.pk)).values_list("action", flat=True)
    assert {"node.agent_register_approve", "node.agent_register"} <= set(actions)


def test_a_rejected_agent_is_refused_and_the_node_keeps_its_credential(node_a, join_token, admin_api):
    backend, a, client_a = node_a
    register(join_token, a.name, fields={"request_key": "attacker-key"})
    pending = PendingAgent.objects.get()
    assert admin_api.post(f"/api/v1/pending-agents/{pending.pk}/reject/").json()["status"] == "rejected"
    refused = register(join_token, a.name, fields={"request_key": "attacker-key"})
    assert refused.status_code == 403 and "rejected" in refused.json()["message"]
    assert _works(client_a, backend)
    assert AuditEvent.objects.filter(action="node.agent_register_reject", object_id=str(a.pk)).exists()


def test_pending_agents_are_listed_and_decided_on_the_join_token_page_by_admins_only(
    node_a, join_token, client, admin_user, operator
):
    _, a, _ = node_a
    register(join_token, a.name, fields={"request_key": "k1"})
    pending = PendingAgent.objects.get()
    page_url = reverse("fleet:agent_token_list")
    client.force_login(operator)
    assert client.get(page_url).status_code == 403
    assert client.post(reverse("fleet:pending_approve", args=[pending.pk])).status_code == 403
    client.force_login(admin_user)
    page = client.get(page_url).content.decode()
    assert 'id="pending-agents"' in page and pending.fingerprint in page and a.name in page
    assert client.post(reverse("fleet:pending_approve", args=[pending.pk])).status_code == 302
    pending.refresh_from_db()
    assert pending.status == "approved" and pending.decided_by == admin_user
    assert pending.fingerprint not in client.get(page_url).content.decode().split('id="pending-agents"')[1][:2000]


def test_a_pending_agent_expires_after_the_setting(node_a, join_token, admin_api, client, admin_user, settings):
    settings.TESSERA = {**settings.TESSERA, "PENDING_AGENT_TTL_HOURS": 2}
    backend, a, client_a = node_a
    register(join_token, a.name, fields={"request_key": "stale-key"})
    pending = PendingAgent.objects.get()
    listed = admin_api.get("/api/v1/pending-agents/").json()["results"]
    expires = pending.requested_at + timedelta(hours=2)
    assert [p["expires_at"] for p in listed] == [expires.isoformat().replace("+00:00", "Z")]
    PendingAgent.objects.update(requested_at=timezone.now() - timedelta(hours=2, minutes=1))
    # Expired: not listed (API, join-token page), not approvable (API, page), the agent's old request not honoured.
    assert admin_api.get("/api/v1/pending-agents/").json()["results"] == []
    refused = admin_api.post(f"/api/v1/pending-agents/{pending.pk}/approve/")
    assert refused.status_code == 409 and "expired" in refused.json()["message"]
    client.force_login(admin_user)
    page = client.get(reverse("fleet:agent_token_list")).content.decode()
    assert pending.fingerprint not in page.split('id="pending-agents"')[1][:2000]
    answer = client.post(reverse("fleet:pending_approve", args=[pending.pk]), follow=True)
    assert "expired" in answer.content.decode()
    assert PendingAgent.objects.get().status == "pending" and _works(client_a, backend)
    # The agent still asking makes a new request, which an admin sees afresh (and audited anew).
    assert register(join_token, a.name, fields={"request_key": "stale-key"}).status_code == 202
    fresh = PendingAgent.objects.get()
    assert fresh.pk != pending.pk and fresh.requested_at > timezone.now() - timedelta(minutes=1)
    assert AuditEvent.objects.filter(action="node.agent_register_pending", object_id=str(a.pk)).count() == 2
    assert admin_api.post(f"/api/v1/pending-agents/{fresh.pk}/approve/").status_code == 200


def test_expired_requests_do_not_count_against_the_limit_per_node(node_a, join_token):
    _, a, _ = node_a
    for i in range(5):
        register(join_token, a.name, fields={"request_key": f"old{i}"})
    PendingAgent.objects.update(requested_at=timezone.now() - timedelta(days=2))
    assert register(join_token, a.name, fields={"request_key": "new"}).status_code == 202


def test_too_many_pending_requests_for_one_node_are_refused(node_a, join_token):
    _, a, _ = node_a
    codes = [register(join_token, a.name, fields={"request_key": f"k{i}"}).status_code for i in range(6)]
    assert codes == [202] * 5 + [429]


def test_join_tokens_bound_to_a_node_name_pattern_or_single_use(admin_api, cluster):
    created = admin_api.post(
        "/api/v1/agent-join-tokens/",
        {"cluster": cluster.pk, "name": "rack b12", "node_name_pattern": "rack-b12-*", "max_uses": 1},
        format="json",
    )
    assert created.status_code == 201 and created.json()["node_name_pattern"] == "rack-b12-*"
    plain = created.json()["token"]
    outside = register(plain, "rack-c07-1")
    assert outside.status_code == 403 and "rack-b12-*" in outside.json()["message"]
    assert register(plain, "rack-b12-1").status_code == 201
    used_up = register(plain, "rack-b12-2")
    assert used_up.status_code == 403 and "used up" in used_up.json()["message"]
    bad = admin_api.post(
        "/api/v1/agent-join-tokens/", {"cluster": cluster.pk, "name": "x", "node_name_pattern": "a b"}, format="json"
    )
    assert bad.status_code == 400 and "node_name_pattern" in bad.json()["errors"]


def test_the_join_token_form_takes_a_node_name_pattern_and_a_service_account(client, admin_user, cluster):
    client.force_login(admin_user)
    form = {"cluster": cluster.pk, "name": "rack b12", "expires_in_hours": 24, "node_name_pattern": "rack-b12-*"}
    assert client.post(reverse("fleet:agent_token_list"), form).status_code == 201
    assert AgentJoinToken.objects.get().node_name_pattern == "rack-b12-*"
    # Reviewing service-account tokens needs the cluster's API credentials: this cluster has none.
    refused = client.post(reverse("fleet:agent_token_list"), {**form, "service_account": "tessera-system:agent"})
    assert refused.status_code == 400 and "no Kubernetes credentials" in refused.content.decode()


# --- the DaemonSet path: the pod's service-account token, reviewed by the cluster's API server ---------------------

ACCOUNT = "tessera-system:tessera-agent"


def _service_account_token(sim, node, account=ACCOUNT, audiences=("tessera",)) -> str:
    namespace, name = account.split(":")
    body = {"namespace": namespace, "serviceAccount": name, "node": node, "audiences": list(audiences)}
    request = urllib.request.Request(
        sim.url + "/_sim/service-account-tokens",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {sim.token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=sim.ca_path), timeout=5) as reply:
        return json.loads(reply.read())["token"]


@pytest.fixture
def reviewed_token(sim, admin_user):
    """A join token of an agent cluster whose API server is the simulator, bound to the agents' service account."""
    cluster = ClusterFactory(name="k8s-agents", driver="agent", kubeconfig_path=sim.kubeconfig_path)
    _, plain = agent_credentials.agent_join_token_create(
        actor=Actor.for_user(admin_user), cluster=cluster, name="daemonset", service_account=ACCOUNT
    )
    return plain


def test_a_service_account_bound_join_token_registers_only_the_pods_own_node(sim, reviewed_token):
    node, other = sorted(sim.nodes)[:2]
    token = _service_account_token(sim, node)
    assert register(reviewed_token, node).status_code == 403  # the shared join token alone: nothing
    impersonating = register(reviewed_token, other, fields={"service_account_token": token})
    assert impersonating.status_code == 403 and f"runs on node {node}" in impersonating.json()["message"]
    wrong_account = _service_account_token(sim, other, account="default:default")
    assert register(reviewed_token, other, fields={"service_account_token": wrong_account}).status_code == 403
    wrong_audience = _service_account_token(sim, other, audiences=("https://kubernetes.default.svc",))
    assert register(reviewed_token, other, fields={"service_account_token": wrong_audience}).status_code == 403
    assert register(reviewed_token, node, fields={"service_account_token": "forged"}).status_code == 403
    first = register(reviewed_token, node, fields={"service_account_token": token})
    assert first.status_code == 201 and first.json()["node_name"] == node
    # A reinstalled node's new pod registers again with no approval: the cluster vouches for it.
    again = register(reviewed_token, node, fields={"service_account_token": _service_account_token(sim, node)})
    assert again.status_code == 201 and again.json()["node_id"] == first.json()["node_id"]
    assert AgentCredential.objects.filter(node_id=first.json()["node_id"], revoked_at__isnull=True).count() == 1
    assert not PendingAgent.objects.exists()
