"""Tasks sent by name once the transaction commits (core.enqueue): services never import the tasks modules."""

import os
import subprocess
import sys

import pytest

from core.enqueue import send_on_commit
from fleet.models import NodePool
from tests.factories import ClusterFactory, NodeFactory


def test_a_task_is_found_by_name_in_a_process_that_never_imported_its_module():
    """A web process imports no tasks module; the registry is filled on first use, as a worker fills it."""
    code = (
        "import sys, django; django.setup(); from core.enqueue import registered_task; "
        "before = 'worker.tasks' in sys.modules; print(before, registered_task('worker.tasks.rollout_advance').name)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "worker.tasks.rollout_advance"]


@pytest.mark.django_db
def test_sent_only_after_commit_and_run_in_process_when_eager(django_capture_on_commit_callbacks):
    cluster = ClusterFactory()
    node = NodeFactory(cluster=cluster, labels={"role": "infer"})
    pool = NodePool.objects.create(cluster=cluster, name="infer", node_selector="role=infer")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        send_on_commit("fleet.tasks.pool_apply_selector", (pool.pk,))
        assert not pool.nodes.exists()  # nothing sent before the commit
    assert len(callbacks) == 1
    assert list(pool.nodes.all()) == [node]
