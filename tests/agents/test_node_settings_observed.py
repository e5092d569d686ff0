"""Node settings an agent reports (host tuning, GPU settings, the QoS node settings it applied): stored on the
inventory path only when they change, audited before → after, compared with the node's QoS policy on its page,
and read-only in the REST API."""

import dataclasses
import html
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from agent import protocol
from agent.backends.simulated import SimulatedBackend
from agent.protocol import AppliedState, NodeSettings, Report
from agents.authentication import AgentRateThrottle
from agents.credentials import agent_register
from core.audit import Actor
from core.models import AuditEvent
from fleet.agent_credentials import agent_join_token_create
from fleet.models import Gpu, Node
from sharing import services as sharing_services
from tests.agents.conftest import fast_path_writes, written
from tests.factories import ClusterFactory, GpuFactory, NodePoolFactory

pytestmark = pytest.mark.django_db
ACTION = "node.settings_reported"


@pytest.fixture(autouse=True)
def _writes_at_once(settings):
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 0}
    AgentRateThrottle.counts._reset()
    yield
    AgentRateThrottle.counts._reset()


@pytest.fixture
def backend():
    backend = SimulatedBackend(seed=5, gpus=2, workload=False)
    yield backend
    backend.close()


@pytest.fixture
def agent(admin_user, backend):
    """(node, agent API client) of a registered agent node that has not reported yet."""
    cluster = ClusterFactory(name="lab", driver="agent", kubeconfig_path="")
    _, plain = agent_join_token_create(actor=Actor.for_user(admin_user), cluster=cluster, name="lab")
    registration = agent_register(join_token=plain, hostname=backend.snapshot().hostname, agent_version="0.2.0")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {registration.credential}")
    return registration.node, client


def report(backend, *, applied=None, **gpu_changes) -> Report:
    """The backend's report; `gpu_changes` maps a GPU index to the GpuReport fields to replace on it."""
    snapshot = backend.snapshot()
    gpus = tuple(dataclasses.replace(g, **gpu_changes.get(f"gpu{g.index}", {})) for g in snapshot.gpus)
    return Report(
        agent_version="0.2.0",
        hostname=snapshot.hostname,
        driver_version=snapshot.driver_version,
        cuda_version=snapshot.cuda_version,
        numa_nodes=snapshot.numa_nodes,
        gpus=gpus,
        xid_events=(),
        host=snapshot.host,
        applied=applied,
    )


def send(client, body) -> None:
    body = body.to_dict() if isinstance(body, Report) else body
    answer = client.post(protocol.REPORT_PATH, body, format="json")
    assert answer.status_code == 200, answer.content


def events(node):
    return list(AuditEvent.objects.filter(action=ACTION, object_id=str(node.pk)))


# --- ingest --------------------------------------------------------------------------------------------------------


def test_a_report_stores_host_tuning_and_gpu_settings_without_an_audit_event(agent, backend):
    node, client = agent
    sent = report(backend)
    send(client, sent)
    node.refresh_from_db()
    assert node.host_settings == {
        "thp": "madvise",
        "swappiness": 60,
        "cpu_governor": "performance",
        "dirty_ratio": 20,
        "dirty_background_ratio": 10,
    }
    assert node.agent_node_settings is None  # nothing applied yet
    first = sent.gpus[0]
    assert Gpu.objects.get(uuid=first.uuid).settings == {
        "compute_mode": first.compute_mode,
        "persistence_mode": first.persistence_mode,
        "power_limit_w": first.power_limit_w,
        "applications_clock_mhz": first.applications_clock_mhz,
        "max_graphics_clock_mhz": first.max_graphics_clock_mhz,
    }
    assert first.power_limit_w and first.max_graphics_clock_mhz  # the simulated backend reads them
    assert events(node) == []  # the first report is no change


def test_a_changed_host_setting_is_recorded_and_audited_once_with_before_and_after(agent, backend):
    node, client = agent
    send(client, report(backend))
    backend.sim.host.set("thp", "always")
    send(client, report(backend))
    assert Node.objects.get(pk=node.pk).host_settings["thp"] == "always"
    (event,) = events(node)
    assert event.before == {"host.thp": "madvise"} and event.after == {"host.thp": "always"}
    assert (event.actor_kind, event.actor_label, event.object_type) == ("system", "tessera-agent", "node")
    assert event.message == "The agent reported 1 changed setting with no new config from Tessera: changed on the node."
    send(client, report(backend))  # the same again: nothing new
    assert len(events(node)) == 1


def test_gpus_that_made_the_same_change_share_one_key(agent, backend):
    node, client = agent
    send(client, report(backend))
    limit = report(backend).gpus[0].power_limit_w
    lower = {"power_limit_w": limit - 100}
    send(client, report(backend, gpu0=lower, gpu1={**lower, "compute_mode": "exclusive_process"}))
    (event,) = events(node)
    assert event.before == {"gpu0-1.power_limit_w": limit, "gpu1.compute_mode": "default"}
    assert event.after == {"gpu0-1.power_limit_w": limit - 100, "gpu1.compute_mode": "exclusive_process"}
    assert "2 changed settings" in event.message
    assert Gpu.objects.get(node=node, index=1).settings["compute_mode"] == "exclusive_process"


def test_the_clock_now_and_other_metrics_stay_on_the_fast_path(agent, backend):
    node, client = agent
    send(client, report(backend))
    stored = Node.objects.get(pk=node.pk).agent_report_hash
    moving = report(backend, gpu0={"graphics_clock_mhz": 1410, "temperature_c": 71}, gpu1={"graphics_clock_mhz": 345})
    with CaptureQueriesContext(connection) as queries:
        send(client, moving)
    statements = written(queries)
    assert statements == fast_path_writes(gpus=2), statements
    assert Node.objects.get(pk=node.pk).agent_report_hash == stored
    assert events(node) == []


def test_a_report_that_applied_a_config_records_what_the_agent_set(agent, backend):
    node, client = agent
    send(client, report(backend))
    backend.sim.host.set("swappiness", 10)
    settings = NodeSettings.from_dict({"gpu": {"gpu_clock_min_mhz": 1200, "gpu_clock_max_mhz": 1500}, "host": {}})
    send(client, report(backend, applied=AppliedState("tessera-cfg-2", node_settings=settings)))
    node.refresh_from_db()
    assert node.agent_node_settings == {"gpu": {"gpu_clock_min_mhz": 1200, "gpu_clock_max_mhz": 1500}, "host": {}}
    (event,) = events(node)
    assert event.after == {"host.swappiness": 10}
    assert event.message.endswith("after applying config tessera-cfg-2.")


def test_an_older_agent_without_the_settings_is_recorded_as_not_reported(agent, backend):
    node, client = agent
    body = report(backend).to_dict()
    for g in body["gpus"]:
        for key in ("power_limit_w", "graphics_clock_mhz", "applications_clock_mhz", "max_graphics_clock_mhz"):
            del g[key]
        g["persistence_mode"] = None
    body["host"] = {key: None for key in body["host"]}
    send(client, body)
    assert Node.objects.get(pk=node.pk).host_settings["thp"] is None
    assert Gpu.objects.get(node=node, index=0).settings["power_limit_w"] is None
    # Readable again (the agent was upgraded): seen for the first time, not a change.
    send(client, report(backend))
    assert Node.objects.get(pk=node.pk).host_settings["thp"] == "madvise"
    assert events(node) == []


def test_kubernetes_observations_leave_the_agents_readings_alone(agent, backend):
    from fleet.observations import NodeObservation
    from fleet.services import inventory_record

    node, client = agent
    send(client, report(backend))
    node.refresh_from_db()
    inventory_record(cluster=node.cluster, nodes=[NodeObservation(name=node.name, ready=True)])
    assert Node.objects.get(pk=node.pk).host_settings == node.host_settings


# --- where they show -----------------------------------------------------------------------------------------------


def text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


@pytest.fixture
def policy_node(agent, backend, admin_user):
    """The agent's node in a pool whose QoS policy asks for persistence off, the board's power limit, THP madvise,
    swappiness 10 and locked clocks: (node, client, policy)."""
    node, client = agent
    actor = Actor.for_user(admin_user)
    pool = NodePoolFactory(cluster=node.cluster, name="train")
    Node.objects.filter(pk=node.pk).update(pool=pool)
    policy = sharing_services.qos_policy_create(
        actor=actor,
        name="train",
        persistence_mode=False,
        power_limit_w=int(report(backend).gpus[0].power_limit_w),
        gpu_clock_min_mhz=1200,
        gpu_clock_max_mhz=1500,
        transparent_hugepages="madvise",
        swappiness=10,
    )
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    return node, client, policy


def _logged_in(client, user):
    client.force_login(user)
    return client


def qos_card(client, node) -> str:
    page = client.get(node.get_absolute_url()).content.decode()
    start = page.index('id="qos-heading"')
    return text(page[start : page.index('id="agent-heading"', start)])


def test_node_page_awaits_a_report_then_shows_desired_beside_what_the_node_runs(client, viewer, policy_node, backend):
    node, agent_client, policy = policy_node
    assert "Awaiting the agent's report" in qos_card(_logged_in(client, viewer), node)
    send(agent_client, report(backend))
    card = qos_card(client, node)
    assert "Awaiting the agent's report" not in card
    assert "Differs: vm.swappiness" in card
    assert "1 of 6 settings differs from what the node reports; 2 not reported" in card
    assert "vm.swappiness · host 10 60 differs" in card
    assert "Transparent huge pages · host madvise madvise matches" in card
    assert "Persistence mode · GPU Off Off all 2 GPUs matches" in card
    limit = int(report(backend).gpus[0].power_limit_w)
    assert f"Power limit · GPU {limit} W {limit} W all 2 GPUs matches" in card
    # Locked clocks cannot be read back; the agent has applied no node settings yet.
    assert (
        "Locked GPU clock, min · GPU 1200 MHz — NVML cannot read it back, and the agent reported no QoS "
        "settings applied not reported"
    ) in card


def test_node_page_says_applied_when_everything_matches(client, viewer, policy_node, backend):
    node, agent_client, policy = policy_node
    backend.sim.host.set("swappiness", 10)
    applied = AppliedState("tessera-cfg", node_settings=NodeSettings.from_dict(policy.node_settings()))
    send(agent_client, report(backend, applied=applied))
    card = qos_card(_logged_in(client, viewer), node)
    assert "Applied" in card and "Differs" not in card and "the node reports every setting as desired" in card
    assert "Locked GPU clock, max · GPU 1500 MHz 1500 MHz as the agent set it: NVML cannot read it back matches" in card


def test_node_page_counts_the_gpus_that_differ(client, viewer, policy_node, backend):
    node, agent_client, policy = policy_node
    backend.sim.host.set("swappiness", 10)
    applied = AppliedState("tessera-cfg", node_settings=NodeSettings.from_dict(policy.node_settings()))
    limit = report(backend).gpus[0].power_limit_w
    send(agent_client, report(backend, applied=applied, gpu1={"power_limit_w": limit - 200}))
    card = qos_card(_logged_in(client, viewer), node)
    assert "Differs: Power limit desired" in card  # the badge names the setting; the card header aside follows
    assert f"{int(limit)} W (1 GPU), {int(limit) - 200} W (1 GPU) 1 of 2 GPUs differs differs" in card


def test_node_page_says_what_an_older_agent_does_not_report(client, viewer, policy_node, backend):
    node, agent_client, policy = policy_node
    body = report(backend).to_dict()
    for g in body["gpus"]:
        del g["power_limit_w"]
    body["host"]["swappiness"] = 10
    send(agent_client, body)
    card = qos_card(_logged_in(client, viewer), node)
    # Power limit and the two clocks: none differs, three cannot be seen.
    assert "3 not reported" in card and "the node does not report 3 of them" in card
    assert "Power limit · GPU" in card and "2 of 2 GPUs not reported" in card


def test_audit_log_shows_the_change(client, admin_user, agent, backend):
    node, agent_client = agent
    send(agent_client, report(backend))
    backend.sim.host.set("thp", "always")
    send(agent_client, report(backend))
    page = text(_logged_in(client, admin_user).get(reverse("audit_log"), {"action": ACTION}).content.decode())
    assert "tessera-agent" in page and ACTION in page and node.name in page
    assert 'host.thp "madvise" → "always"' in page


def test_rest_api_shows_the_readings(viewer_api, agent, backend):
    node, agent_client = agent
    settings = NodeSettings.from_dict({"gpu": {"power_limit_w": 500}, "host": {"swappiness": 60}})
    send(agent_client, report(backend, applied=AppliedState("tessera-cfg", node_settings=settings)))
    detail = viewer_api.get(f"/api/v1/nodes/{node.pk}/").data
    assert detail["host_settings"]["thp"] == "madvise" and detail["host_settings"]["swappiness"] == 60
    assert detail["agent_node_settings"] == {"gpu": {"power_limit_w": 500}, "host": {"swappiness": 60}}
    gpu = Gpu.objects.get(node=node, index=0)
    gpu_detail = viewer_api.get(f"/api/v1/gpus/{gpu.pk}/").data
    assert gpu_detail["settings"] == gpu.settings and gpu_detail["settings"]["compute_mode"] == "default"
    listed = viewer_api.get("/api/v1/gpus/", {"q": gpu.uuid}).data["results"]
    assert listed == [gpu_detail]


def test_gpu_page_shows_the_settings_the_agent_read(client, viewer, agent, backend):
    node, agent_client = agent
    unreported = GpuFactory()
    page = lambda g: text(_logged_in(client, viewer).get(reverse("console:gpu_detail", args=[g.pk])).content.decode())  # noqa: E731
    assert "Not reported: only Tessera's node agent reads them" in page(unreported)
    send(agent_client, report(backend))
    gpu = Gpu.objects.get(node=node, index=0)
    shown = page(gpu)
    assert "Compute mode default" in shown and "Not reported" not in shown
    assert f"Power limit {gpu.settings['power_limit_w']:.0f} W" in shown
