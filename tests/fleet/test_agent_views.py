"""Agent pages: join tokens (admins only; the token shown once with the command lines, never in the list; revoke),
a node's agent card (version, last report, credential, revoke) and QoS settings card, a GPU's XID/ECC history, and
stale agents on the overview."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from agents.credentials import agent_register
from agents.observations import xid_message
from core.audit import Actor
from core.models import AuditEvent
from fleet.agent_credentials import agent_join_token_create
from fleet.models import AgentCredential, AgentJoinToken, GpuEvent, Node
from sharing import services as sharing_services
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def login(client, user):
    client.force_login(user)
    return client


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


@pytest.fixture
def cluster():
    return ClusterFactory(name="lab", driver="agent", kubeconfig_path="")


@pytest.fixture
def registered(cluster, admin_user):
    """A node registered by its agent (with a credential) that reported a moment ago."""
    _, plain = agent_join_token_create(actor=Actor.for_user(admin_user), cluster=cluster, name="rack-a")
    registration = agent_register(join_token=plain, hostname="lab-gpu-01", agent_version="0.9.1")
    Node.objects.filter(pk=registration.node.pk).update(
        agent_last_seen_at=timezone.now(), last_seen_at=timezone.now(), ready=True
    )
    return Node.objects.get(pk=registration.node.pk)


def token_data(cluster, **overrides):
    return {"cluster": cluster.pk, "name": "rack-b12", "expires_in_hours": "24", "max_uses": "", **overrides}


# --- join tokens ---------------------------------------------------------------------------------------------------


def test_token_page_is_for_admins_only(client, viewer, operator, cluster, admin_user):
    token, _ = agent_join_token_create(actor=Actor.for_user(admin_user), cluster=cluster, name="t")
    for user in (viewer, operator):
        login(client, user)
        assert client.get(reverse("fleet:agent_token_list")).status_code == 403
        assert client.post(reverse("fleet:agent_token_list"), token_data(cluster)).status_code == 403
        assert client.post(reverse("fleet:agent_token_revoke", args=[token.pk])).status_code == 403
        assert 'href="/agents/tokens/"' not in client.get(reverse("console:overview")).content.decode()
    assert AgentJoinToken.objects.count() == 1 and AgentJoinToken.objects.get().revoked_at is None


def test_token_page_needs_login(client):
    response = client.get(reverse("fleet:agent_token_list"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_create_shows_the_token_once_with_the_commands(client, admin_user, cluster):
    login(client, admin_user)
    response = client.post(reverse("fleet:agent_token_list"), token_data(cluster, max_uses="20"))
    html = response.content.decode()
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    plain = re.search(r'id="join-token" type="text" value="(tsj_[^"]+)"', html).group(1)
    token = AgentJoinToken.objects.get()
    assert (token.name, token.cluster, token.max_uses, token.uses) == ("rack-b12", cluster, 20, 0)
    assert plain.startswith(f"tsj_{token.key_id}_") and plain not in token.secret_hash
    assert abs((token.expires_at - timezone.now()) - timedelta(hours=24)) < timedelta(minutes=1)
    assert f"python -m agent --server http://testserver --join-token {plain}" in html
    assert "kubectl -n tessera-system create secret generic tessera-agent-join" in html
    assert f"--from-literal=server=http://testserver --from-literal=join-token={plain}" in html
    assert "it is shown this once" in html
    # the list never shows it again
    again = client.get(reverse("fleet:agent_token_list")).content.decode()
    assert plain not in again and token.key_id in again and "rack-b12" in again and "0 / 20" in again
    assert AuditEvent.objects.filter(action="agent_join_token.create", actor_label="admin").exists()
    # the token works: an agent registers with it
    assert agent_register(join_token=plain, hostname="n1", agent_version="1").node.name == "n1"


def test_create_refused_shows_errors_beside_the_fields(client, admin_user, cluster):
    k8s = ClusterFactory(name="prod", driver="kubernetes")
    login(client, admin_user)
    response = client.post(reverse("fleet:agent_token_list"), token_data(k8s, name="", expires_in_hours="0"))
    html = response.content.decode()
    assert response.status_code == 400 and not AgentJoinToken.objects.exists()
    assert "Select a valid choice" in html and "This field is required." in html
    assert "greater than or equal to 1" in html
    assert 'id="join-token"' not in html
    page = client.get(reverse("fleet:agent_token_list")).content.decode()
    assert f'<option value="{cluster.pk}">lab</option>' in page and ">prod<" not in page  # agent clusters only


def test_without_agent_clusters_the_page_says_how_to_add_one(client, admin_user):
    ClusterFactory(name="prod", driver="kubernetes")
    html = login(client, admin_user).get(reverse("fleet:agent_token_list")).content.decode()
    assert "No cluster uses the agent driver" in html and "No join tokens yet" in html


def test_revoke_a_token(client, admin_user, cluster):
    token, _ = agent_join_token_create(actor=Actor.for_user(admin_user), cluster=cluster, name="t")
    login(client, admin_user)
    response = client.post(reverse("fleet:agent_token_revoke", args=[token.pk]))
    assert response.status_code == 302 and response["Location"] == reverse("fleet:agent_token_list")
    token.refresh_from_db()
    assert token.revoked_at is not None
    html = client.get(response["Location"]).content.decode()
    assert "Join token t revoked" in html and "Revoked" in html
    assert f'action="/agents/tokens/{token.pk}/revoke/"' not in html  # nothing left to revoke
    again = client.post(reverse("fleet:agent_token_revoke", args=[token.pk]), **HTMX)
    assert again.status_code == 200 and again["HX-Location"]
    assert "already revoked" in client.get(reverse("fleet:agent_token_list")).content.decode()


def test_token_states(client, admin_user, cluster):
    actor = Actor.for_user(admin_user)
    expired, _ = agent_join_token_create(actor=actor, cluster=cluster, name="old")
    AgentJoinToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(hours=1))
    used, plain = agent_join_token_create(actor=actor, cluster=cluster, name="one-shot", max_uses=1)
    agent_register(join_token=plain, hostname="n1", agent_version="1")
    active, _ = agent_join_token_create(actor=actor, cluster=cluster, name="fresh")
    html = login(client, admin_user).get(reverse("fleet:agent_token_list")).content.decode()
    assert "Expired" in html and "Used up" in html and "1 / 1" in html
    # Only a token that can still register a node offers Revoke: a used-up or expired one has nothing to stop.
    assert f'action="/agents/tokens/{active.pk}/revoke/"' in html
    assert f'action="/agents/tokens/{used.pk}/revoke/"' not in html
    assert f'action="/agents/tokens/{expired.pk}/revoke/"' not in html


# --- node page: agent and QoS ----------------------------------------------------------------------------------------


def test_agent_card_shows_version_last_report_and_credential(client, admin_user, viewer, registered):
    # Read 12 s after the agent's report, however long the test took to get here on a loaded box.
    with time_machine.travel(registered.agent_last_seen_at + timedelta(seconds=12), tick=False):
        html = login(client, viewer).get(registered.get_absolute_url()).content.decode()
    page = text(html)
    credential = AgentCredential.objects.get(node=registered)
    assert "Tessera agent" in page and "0.9.1" in page and "Reporting" in page
    assert "12 seconds ago" in page
    assert credential.key_id in page and "with token rack-a" in page
    assert "Revoke credential" not in html  # admins only
    assert "Revoke credential" in login(client, admin_user).get(registered.get_absolute_url()).content.decode()


def test_revoke_a_nodes_agent_credential(client, admin_user, operator, registered):
    url = reverse("fleet:node_agent_revoke", args=[registered.pk])
    assert login(client, operator).post(url).status_code == 403
    response = login(client, admin_user).post(url)
    assert response.status_code == 302 and response["Location"] == registered.get_absolute_url()
    assert AgentCredential.objects.get(node=registered).revoked_at is not None
    html = client.get(response["Location"]).content.decode()
    assert "Agent credential of lab-gpu-01 revoked" in html and "Revoked" in html
    assert "Revoke credential" not in html and 'href="/agents/tokens/"' in html
    again = client.post(url)
    assert "has no active agent credential" in client.get(again["Location"]).content.decode()


def test_stale_agent_is_marked(client, viewer, registered):
    Node.objects.filter(pk=registered.pk).update(agent_last_seen_at=timezone.now() - timedelta(minutes=10))
    html = login(client, viewer).get(registered.get_absolute_url()).content.decode()
    assert '<span class="badge badge--stale">Stale</span>' in html


def test_qos_card_on_an_agent_node_awaits_the_agents_report(client, viewer, admin_user, cluster, registered):
    actor = Actor.for_user(admin_user)
    pool = NodePoolFactory(cluster=cluster, name="train")
    Node.objects.filter(pk=registered.pk).update(
        pool=pool, kubelet_config={"topologyManagerPolicy": "best-effort", "cpuManagerPolicy": "static"}
    )
    policy = sharing_services.qos_policy_create(
        actor=actor,
        name="train",
        persistence_mode=True,
        power_limit_w=600,
        swappiness=10,
        topology_manager_policy="single-numa-node",
        cpu_manager_policy="static",
    )
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    html = login(client, viewer).get(registered.get_absolute_url()).content.decode()
    page = text(html)
    assert "QoS settings" in page and f'href="/qos/{policy.pk}/"' in html
    assert "Persistence mode · GPU On" in page and "Power limit · GPU 600 W" in page
    assert "vm.swappiness · host 10" in page
    assert "Awaiting the agent's report" in page
    assert "topologyManagerPolicy single-numa-node best-effort" in page and "≠" in html
    assert "cpuManagerPolicy static static" in page and "✓" in html
    assert "not checked yet" in page


def test_qos_card_on_a_kubernetes_node_says_it_is_not_enforced(client, viewer, admin_user):
    actor = Actor.for_user(admin_user)
    pool = NodePoolFactory(name="inference")
    node = NodeFactory(cluster=pool.cluster, pool=pool, name="k8s-gpu-01")
    policy = sharing_services.qos_policy_create(actor=actor, name="inf", transparent_hugepages="never")
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    sharing_services.qos_compliance_record(pool=pool, policy=policy)
    html = login(client, viewer).get(node.get_absolute_url()).content.decode()
    page = text(html)
    assert "Not enforced here" in page and "no Tessera agent on this node" in page
    assert "Transparent huge pages · host never" in page
    assert "Compliant" in page and "Revoke credential" not in html


def test_node_without_policy_says_nothing_applies(client, viewer, registered):
    html = text(login(client, viewer).get(registered.get_absolute_url()).content.decode())
    assert "No QoS policy applies: the node is in no pool" in html


# --- GPU page and overview -------------------------------------------------------------------------------------------


def test_gpu_page_lists_xid_and_ecc_events_newest_first(client, viewer, registered):
    gpu = GpuFactory(node=registered, index=0)
    now = timezone.now()
    GpuEvent.objects.create(gpu=gpu, at=now - timedelta(hours=2), kind="xid", code=13, message=xid_message(13))
    GpuEvent.objects.create(
        gpu=gpu,
        at=now - timedelta(minutes=5),
        kind="xid",
        code=79,
        gpu_instance_id=1,
        compute_instance_id=0,
        message=xid_message(79),
    )
    GpuEvent.objects.create(
        gpu=gpu, at=now - timedelta(minutes=1), kind="ecc", code=3, message="2 new uncorrectable ECC error(s)"
    )
    html = login(client, viewer).get(gpu.get_absolute_url()).content.decode()
    page = text(html)
    assert "XID and ECC history" in page
    assert html.index("3 total") < html.index("fallen off the bus") < html.index("graphics engine exception")
    assert "GI 1 / CI 0" in page and "whole GPU" in page


def test_gpu_page_without_events(client, viewer):
    gpu = GpuFactory()
    html = login(client, viewer).get(gpu.get_absolute_url()).content.decode()
    assert "XID and ECC history comes from the Tessera agent" in html


def test_overview_shows_stale_agents(client, admin_user, registered, cluster):
    NodeFactory(cluster=cluster, name="lab-gpu-02", last_seen_at=timezone.now() - timedelta(minutes=10))
    html = login(client, admin_user).get(reverse("console:overview")).content.decode()
    [item] = [i for i in re.findall(r'<li><a href="/agents/tokens/">(.*?)</a></li>', html, re.S) if "Stale" in i]
    assert "Stale agents" in item and "of 2 agent nodes" in item
    assert '<span class="attention__count">1</span>' in item
