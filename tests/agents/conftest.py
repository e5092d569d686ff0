"""Shared by the agent endpoint tests: an agent cluster and its join token, simulated backends, a registered node,
and the calls an agent makes (against the real API through DRF's test client)."""

import dataclasses

import pytest
from django.db import connection
from rest_framework.test import APIClient

from agent import protocol
from agent.backends.simulated import SimulatedBackend
from agent.protocol import Report, inventory_digest
from agents.authentication import AgentRateThrottle, AgentRegisterThrottle
from core.audit import Actor
from fleet import agent_credentials
from fleet.models import Node
from sharing import services as sharing_services
from tests.factories import ClusterFactory, NodePoolFactory
from worker import reconcile
from worker import services as worker_services
from worker.choices import ChangeStatus
from worker.models import NodeChange

H100 = "NVIDIA-H100-80GB-HBM3"


def written(queries) -> list[str]:
    """The statements of captured queries up to their SET clause, without the test's savepoints and the flush's
    `SET LOCAL synchronous_commit` (PostgreSQL): the writes. A batched UPDATE (`WITH v AS (… unnest …) UPDATE`,
    PostgreSQL) shows as its UPDATE."""
    skip = ("SAVEPOINT", "RELEASE SAVEPOINT", "SET LOCAL")
    heads = [q["sql"].split(" SET ")[0] for q in queries if not q["sql"].startswith(skip)]
    return [head[head.rfind("UPDATE ") :] if head.startswith("WITH ") else head for head in heads]


def fast_path_writes(gpus: int) -> list[str]:
    """What `written` shows for the usual report: the node's last-seen and its GPUs' metrics, row by row (one
    executemany each) or, on PostgreSQL, one statement per table over arrays of the rows."""
    if connection.vendor == "postgresql":
        return ['UPDATE "fleet_node" t', 'UPDATE "fleet_gpu" t']
    return ['1 times: UPDATE "fleet_node"', f'{gpus} times: UPDATE "fleet_gpu"']


def clear_throttle_counts():
    for throttle in (AgentRateThrottle, AgentRegisterThrottle):
        throttle.counts._reset()


@pytest.fixture
def fresh_throttle_counts_and_writes_at_once(settings):
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 0}
    clear_throttle_counts()
    yield
    clear_throttle_counts()


@pytest.fixture
def cluster():
    return ClusterFactory(name="lab", driver="agent", kubeconfig_path="")


@pytest.fixture
def join_token(cluster, admin_user):
    _, plain = agent_credentials.agent_join_token_create(actor=Actor.for_user(admin_user), cluster=cluster, name="lab")
    return plain


@pytest.fixture
def backends():
    made = []

    def make(seed=0, gpus=2, **options):
        backend = SimulatedBackend(seed=seed, gpus=gpus, workload=False, **options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def report_of(backend, *, hostname=None, applied=None, xids=(), gpus=None) -> Report:
    """The report an agent on this backend sends."""
    snapshot = backend.snapshot()
    return Report(
        agent_version="0.1.0",
        hostname=hostname or snapshot.hostname,
        driver_version=snapshot.driver_version,
        cuda_version=snapshot.cuda_version,
        numa_nodes=snapshot.numa_nodes,
        gpus=snapshot.gpus if gpus is None else gpus,
        xid_events=tuple(xids),
        host=snapshot.host,
        applied=applied,
    )


def vouched(report: Report) -> Report:
    """The report as the agent sends it: with the digest of its inventory."""
    return dataclasses.replace(report, inventory_digest=inventory_digest(report))


def register(token, hostname, client=None, fields=None, **headers):
    """POST /api/v1/agent/register/ as an agent does; `fields`: further RegisterRequest fields."""
    client = client or APIClient()
    body = {"join_token": token, "hostname": hostname, "agent_version": "0.1.0", **(fields or {})}
    return client.post(protocol.REGISTER_PATH, body, format="json", **headers)


def agent_client(credential) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")
    return client


@pytest.fixture
def node_a(join_token, backends):
    """A registered node with 2 simulated H100s: (backend, node, agent client)."""
    backend = backends(seed=1)
    answer = register(join_token, backend.snapshot().hostname).json()
    return backend, Node.objects.get(pk=answer["node_id"]), agent_client(answer["credential"])


@pytest.fixture
def rollout_on_a(node_a, admin_user):
    """A MIG profile assigned to node A's pool, its rollout started: the change is verifying (the agent's turn)."""
    backend, node, client = node_a
    client.post(protocol.REPORT_PATH, report_of(backend).to_dict(), format="json")
    pool = NodePoolFactory(cluster=node.cluster)
    Node.objects.filter(pk=node.pk).update(pool=pool)
    actor = Actor.for_user(admin_user)
    profile = sharing_services.profile_create(
        actor=actor, name="mig-3", mode="mig", target_products=[H100], mig_layouts={"all": {"3g.40gb": 2}}
    )
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    if not NodeChange.objects.filter(node=node).exists():  # where transactions commit, eager tasks ran these
        (rollout_id,) = reconcile.reconcile()
        worker_services.node_changes_step(worker_services.rollout_advance(rollout_id))
    change = NodeChange.objects.get(node=node)
    assert change.status == ChangeStatus.VERIFYING
    return backend, node, client, change
