"""Tessera's node watch across restarts of the simulator (`python -m simulator`, as `make run` starts it): after a
clean stop it resumes from its resourceVersion without listing again; after a kill it gets 410 Gone and lists again;
either way nothing Tessera recorded is lost, and later changes arrive."""

import signal
import threading

import pytest

from fleet.models import Node
from tests.factories import ClusterFactory
from tests.processes import SimulatorProcess, free_port, wait_until
from worker.inventory.watch import ClusterWatcher

MERGE = "application/merge-patch+json"


def label(core, node: str, value: str) -> None:
    core.patch_node(node, {"metadata": {"labels": {"tessera.io/pool": value}}}, _content_type=MERGE)


def recorded(node: str, value: str) -> bool:
    return Node.objects.get(name=node).labels.get("tessera.io/pool") == value


@pytest.mark.django_db(transaction=True)
def test_the_watch_resumes_after_a_clean_restart_and_lists_again_after_a_kill(tmp_path):
    port = free_port()
    sim = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
    cluster = ClusterFactory(name="sim", kubeconfig_path=str(sim.kubeconfig), metrics_url=f"{sim.url}/metrics")
    core = sim.core()
    watcher = ClusterWatcher(cluster, batch_seconds=0.2, watch_seconds=30, gpus_on_start=False)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: watcher.stats.streams >= 1, timeout=20, message="the watch to start")
        label(core, "gpu-node-0001", "inference")
        wait_until(lambda: recorded("gpu-node-0001", "inference"), timeout=10, message="the first label")

        assert sim.stop(signal.SIGTERM) == 0
        sim = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")  # same port, token and certificate
        label(core, "gpu-node-0002", "training")
        wait_until(lambda: recorded("gpu-node-0002", "training"), timeout=30, message="a change after the restart")
        assert (watcher.stats.lists, watcher.stats.gone) == (1, 0)  # resumed from its version

        label(core, "gpu-node-0003", "batch")
        sim.wait_saved(int(core.read_node("gpu-node-0003").metadata.resource_version))
        sim.stop(signal.SIGKILL)
        sim = SimulatorProcess(tmp_path, port, "--apply-delay", "0.2")
        label(core, "gpu-node-0004", "serving")
        wait_until(lambda: recorded("gpu-node-0004", "serving"), timeout=30, message="a change after the kill")
        assert watcher.stats.gone == 1 and watcher.stats.lists == 2  # 410 Gone: listed again
        assert all(recorded(n, v) for n, v in [("gpu-node-0001", "inference"), ("gpu-node-0003", "batch")])
    finally:
        watcher.stop()
        thread.join(10)
        sim.stop()
