"""A real Celery worker process runs Tessera's tasks on the embedded broker (filesystem) and on Redis."""

import os

import pytest
from kombu import Connection

from config.celery import app
from fleet.models import Node, NodePool
from tests.factories import ClusterFactory, NodeFactory
from tests.processes import celery_worker, wait_until

pytestmark = [
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored"),
]


def _broker(kind: str, tmp_path):
    if kind == "filesystem":
        folders = {key: tmp_path / "celery" / name for key, name in
                   (("data_folder_in", "queue"), ("data_folder_out", "queue"), ("processed_folder", "processed"),
                    ("control_folder", "control"))}  # fmt: skip
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        return "tessera-fs://", {key: str(path) for key, path in folders.items()}
    url = os.environ.get("REDIS_URL")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail("REDIS_URL must be set in CI: the Redis broker test may not skip there.")
        pytest.skip("REDIS_URL not set")
    return url, {}


@pytest.mark.parametrize("kind", ["filesystem", "redis"])
def test_worker_process_runs_a_task_from_the_broker(kind, tmp_path):
    broker_url, transport_options = _broker(kind, tmp_path)
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster, labels={"tier": "gold"})
    NodeFactory(cluster=cluster, labels={"tier": "bronze"})
    pool = NodePool.objects.create(cluster=cluster, name="gold", node_selector="tier=gold")

    with celery_worker(tmp_path, broker_url):
        with Connection(broker_url, transport_options=transport_options) as conn:
            app.send_task("fleet.tasks.pool_apply_selector", args=[pool.pk], connection=conn)
        wait_until(
            lambda: Node.objects.filter(pk=node.pk, pool=pool).exists(),
            timeout=60,
            message=f"the {kind} worker to assign the node to its pool",
        )
    assert list(pool.nodes.all()) == [node]
