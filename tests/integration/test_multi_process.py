"""More than one of everything (issue 19, point 2; docs/operations.md#supported-topology): two web servers, two
Celery workers and two beats on PostgreSQL and Redis, and one cluster watcher, roll a MIG profile out to 1,000
simulated H100 nodes; one worker and one web server are SIGKILLed mid-rollout and the API is used through the other.
Then: the rollout succeeded, MIG Manager applied each node's config exactly once, each node change's transitions
were recorded exactly once, and beat's reconcile tick (where schedules are evaluated) ran once per period however
many beats sent it."""

import json
import os
import signal
import urllib.request
from collections import Counter
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from core.audit import Actor
from core.models import AuditEvent, PeriodicRun
from core.roles import Role
from core.services import api_token_rotate
from fleet.models import Gpu, Node, NodePool
from sharing import services as sharing_services
from tests.factories import UserFactory
from tests.integration.test_rollout_faults import TRANSITIONS
from tests.processes import celery_beat, celery_worker, kill_tree, manage_py, wait_until, web_server_process
from worker.drivers import driver_for
from worker.inventory.cluster import sync_cluster_full
from worker.models import NodeChange, Rollout

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
NODES = 1000
H100 = "NVIDIA-H100-80GB-HBM3"
TICK_SECONDS = 3
MIG_CONFIG = "nvidia.com/mig.config"


@pytest.fixture
def sim_options() -> dict:
    return {"nodes": 2600, "workload_pods": 0}  # ~1,000 of the seeded nodes are ready H100s


def _require_postgresql_and_redis() -> str:
    problems = []
    if connection.vendor != "postgresql":
        problems.append("a PostgreSQL DATABASE_URL")
    if not os.environ.get("REDIS_URL"):
        problems.append("REDIS_URL")
    if problems:
        message = f"the multi-process test needs {' and '.join(problems)}"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; it is required in CI")
        pytest.skip(message)
    return os.environ["REDIS_URL"]


def _fleet(sim, sim_cluster):
    """The simulator's first 1,000 ready H100 nodes in a pool, the cluster adopted and synced, a 7×1g.10gb profile."""
    driver_for(sim_cluster).adopt_operator_configs()
    assert sim.settle(60)
    sync_cluster_full(sim_cluster, metrics=False)
    h100 = set(Gpu.objects.filter(product=H100, index=0).values_list("node__name", flat=True))
    names = sorted(n for n in Node.objects.filter(ready=True).values_list("name", flat=True) if n in h100)[:NODES]
    assert len(names) == NODES
    pool = NodePool.objects.create(cluster=sim_cluster, name="h100")
    Node.objects.filter(name__in=names).update(pool=pool)
    profile = sharing_services.profile_create(
        actor=Actor.system("test-admin"), name="mig-7", mode="mig", target_products=[H100],
        mig_layouts={"all": {"1g.10gb": 7}},
    )  # fmt: skip
    return pool, profile, names


def _mig_config_changes(sim) -> Counter:
    """Per node, how many writes the simulated API server commits from now on that change its `nvidia.com/mig.config`
    label (the change Tessera makes; a write of the same value changes nothing)."""
    counts = Counter()

    def record(change) -> None:
        if change.resource.plural == "nodes" and change.old is not None:
            before, after = (o["metadata"].get("labels", {}).get(MIG_CONFIG) for o in (change.old, change.entry.obj))
            if before != after:
                counts[change.entry.obj["metadata"]["name"]] += 1

    sim.store.add_listener(record)
    return counts


def _operator_token() -> str:
    user = UserFactory(username="ops")
    user.groups.add(Group.objects.get_or_create(name=Role.OPERATOR.group_name)[0])  # transactional tests flush them
    return api_token_rotate(user=user)[1]


def _api(url: str, token: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_two_of_everything_survive_kills_and_change_every_node_once(sim, core, sim_cluster, tmp_path):
    redis_url = _require_postgresql_and_redis()
    pool, profile, names = _fleet(sim, sim_cluster)
    label_changes = _mig_config_changes(sim)
    token = _operator_token()
    env = {
        "CELERY_BROKER_URL": redis_url,
        "TESSERA_RECONCILE_SECONDS": str(TICK_SECONDS),
        "TESSERA_STEP_POLL_SECONDS": "0.5",
        "TESSERA_ROLLOUT_BATCH_SIZE": "250",
        "TESSERA_ROLLOUT_CANARIES": "1",
        "TESSERA_ROLLOUT_MAX_FAILURES": "5",
        "TESSERA_INVENTORY_SECONDS": "3600",  # a metrics scrape of 2,600 nodes takes a worker for half a minute
    }
    log = tmp_path.joinpath
    with (
        manage_py(tmp_path, "watch_clusters", name="watcher"),
        celery_worker(tmp_path, redis_url, log_path=log("worker-1.log"), name="worker-1", **env) as worker_1,
        celery_worker(tmp_path, redis_url, log_path=log("worker-2.log"), name="worker-2", **env),
        celery_beat(tmp_path, redis_url, log_path=log("beat-1.log"), **env),
        celery_beat(tmp_path, redis_url, log_path=log("beat-2.log"), **env),
        web_server_process(tmp_path, workers=2, threads=2, eager_tasks=False, **env) as (web_1, web_1_proc),
        web_server_process(tmp_path, workers=2, threads=2, eager_tasks=False, **env) as (web_2, _),
    ):
        _api(web_1, token, f"/api/v1/profiles/{profile.pk}/assign/", {"pool": pool.pk})

        def midway() -> bool:
            statuses = Counter(NodeChange.objects.values_list("status", flat=True))
            return statuses["succeeded"] >= 100 and statuses["succeeded"] + statuses["queued"] < NODES

        wait_until(midway, timeout=180, interval=0.2, message="a rollout a tenth done, nodes mid-change")
        kill_tree(worker_1.pid)
        kill_tree(web_1_proc.pid)
        assert worker_1.wait(10) == -signal.SIGKILL and web_1_proc.wait(10) == -signal.SIGKILL

        rollouts = list(Rollout.objects.values("pk", "title", "trigger", "status", "actor_label"))
        assert len(rollouts) == 1, rollouts  # one rollout: the two workers' reconcile passes did not plan it twice
        rollout_id = rollouts[0]["pk"]

        def finished() -> dict | None:
            rollout = _api(web_2, token, f"/api/v1/rollouts/{rollout_id}/")  # through the web server left
            return rollout if rollout["status"] != "running" else None

        rollout = wait_until(finished, timeout=300, interval=1, message="the rollout to finish")

        def ten_ticks() -> bool:
            """Enough periods to show the beats sharing them out (a fast rollout may finish within fewer)."""
            return PeriodicRun.objects.filter(name="reconcile-tick").count() >= 10

        wait_until(ten_ticks, timeout=20 * TICK_SECONDS, message="ten reconcile-tick periods")
    assert rollout["status"] == "succeeded", rollout

    changes = list(NodeChange.objects.filter(rollout_id=rollout_id).select_related("node"))
    assert Counter(c.status for c in changes) == {"succeeded": NODES}
    transitions: dict[str, list[str]] = {}
    for object_id, action in (
        AuditEvent.objects.filter(object_type="nodechange").order_by("pk").values_list("object_id", "action")
    ):
        transitions.setdefault(object_id, []).append(action)
    for change in changes:
        assert transitions[str(change.pk)] == list(TRANSITIONS), change.node.name  # none lost, none repeated
        assert change.attempts == 1, change.node.name
    assert label_changes == dict.fromkeys(names, 1)  # every pool node changed exactly once, no other node
    for change in changes[::50]:  # and runs the config its change applied
        labels = core.read_node(change.node.name).metadata.labels
        assert (labels[MIG_CONFIG], labels["nvidia.com/mig.config.state"]) == (change.applied_mig_config, "success")

    ticks = list(PeriodicRun.objects.filter(name="reconcile-tick").order_by("period_start"))
    periods = [run.period_start for run in ticks]
    assert all(b - a == timedelta(seconds=TICK_SECONDS) for a, b in zip(periods, periods[1:], strict=False)), periods
    assert len({run.claimed_by for run in ticks}) == 2  # both beats sent ticks; each period went to one of them
    unfinished = [run for run in ticks if run.finished_at is None]
    assert len(unfinished) <= 2, unfinished  # at most the tick on the killed worker, and one in flight at the end
    lost_to_the_other_beat = sum(log(f"beat-{i}.log").read_text().count("was sent by another beat") for i in (1, 2))
    assert lost_to_the_other_beat >= len(ticks) // 2  # periods were due at both beats, and one claim won each
