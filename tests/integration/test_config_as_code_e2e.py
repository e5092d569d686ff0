"""End to end (issue 28): the demo fleet plus a simulated cluster whose pool has profiles, a QoS policy, a schedule
and a Kueue binding, rolled out. The `tessera` command (a child process, the client's own package) talks to a real
Tessera server (gunicorn on the test database, tasks not run by it): `export` then `diff` plans nothing. Then a
fresh install — the database emptied, the clusters registered again (the demo's inventory, a second simulator from
the same seed) — gets the exported files with `apply`: every object comes back as it was, and the reconcile loop
rolls the second simulator's nodes to the configs the first one's run.

The schedule is evaluated at an instant passed explicitly (`reconcile(at=…)`), so no clock is travelled."""

import os
import subprocess
import sys
from datetime import datetime, time
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from kubernetes import client, config

from core.audit import Actor
from core.models import AuditEvent
from core.services import api_token_rotate
from fleet.demo import seed_demo
from fleet.models import Node, NodePool
from scheduling import kueue
from scheduling import services as scheduling_services
from sharing import services as sharing_services
from simulator import Simulator
from tests.factories import ClusterFactory, UserFactory
from tests.integration.test_rollout_faults import drive
from tests.processes import ROOT, web_server_process
from worker import reconcile
from worker.drivers import driver_for
from worker.inventory.cluster import sync_cluster_full
from worker.models import Rollout

pytestmark = [
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored"),
]
H100 = "NVIDIA-H100-80GB-HBM3"
POOL_NODES = ("gpu-node-0002", "gpu-node-0005")  # the seed's two H100 nodes of 8 GPUs
NOON = datetime(2026, 3, 4, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))  # a Wednesday, inside the day window
CONFIG_LABELS = ("nvidia.com/mig.config", "nvidia.com/device-plugin.config", "nvidia.com/mig.config.state")


def _simulator() -> Simulator:
    return Simulator(nodes=12, seed=7, apply_delay=0.0, workload_pods=0)


def _register(sim: Simulator):
    """Cluster `sim` on this simulator, its ClusterPolicy pointed at Tessera's configs, its inventory read."""
    cluster = ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path, metrics_url=f"{sim.url}/metrics")
    driver_for(cluster).adopt_operator_configs()
    sync_cluster_full(cluster)
    return cluster


def _roll_out(sim: Simulator, cluster) -> None:
    """What the reconcile loop does at NOON, each rollout driven to its end against the simulator."""
    for rollout_id in reconcile.reconcile(at=NOON):
        Rollout.objects.filter(pk=rollout_id).update(canary_count=0, batch_size=10)
        assert drive(Rollout.objects.get(pk=rollout_id), sim).status == "succeeded"
    sync_cluster_full(cluster)


def _node_configs(sim: Simulator) -> dict[str, dict[str, str]]:
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        nodes = client.CoreV1Api(api).list_node().items
    return {n.metadata.name: {k: n.metadata.labels.get(k) for k in CONFIG_LABELS} for n in nodes}


def _desired_state(cluster) -> None:
    """The sim cluster's pool as an admin sets it up in the UI: explicit members, a default profile and QoS policy,
    a schedule running MIG on weekdays, its Kueue quota kept."""
    actor = Actor.system("test-admin")
    pool = NodePool.objects.create(cluster=cluster, name="h100", description="Both H100 nodes.")
    Node.objects.filter(cluster=cluster, name__in=POOL_NODES).update(pool=pool)
    mig = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    whole = sharing_services.profile_create(actor=actor, name="whole", mode="passthrough", target_products=[H100])
    sharing_services.profile_create(
        actor=actor, name="shared-4", mode="time_slicing", target_products=[H100], replicas=4, description="Spare."
    )
    policy = sharing_services.qos_policy_create(actor=actor, name="serving", required_qos="guaranteed")
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=whole)
    sharing_services.pool_set_qos_policy(actor=actor, pool=pool, policy=policy)
    scheduling_services.schedule_create(
        actor=actor,
        pool=pool,
        name="mig-by-day",
        time_zone="Europe/Berlin",
        busy_policy="drain",
        windows=[{"name": "day", "weekdays": [0, 1, 2, 3, 4], "start": time(8), "end": time(20), "profile": mig}],
        exceptions=[{"date": "2026-12-25", "note": "Christmas"}],
    )
    kueue.kueue_binding_set(actor=actor, pool=pool, cluster_queues=["gpu"], lead_minutes=30)


def _tessera(url: str, token: str, *args: str) -> subprocess.CompletedProcess:
    """The `tessera` command as a pipeline runs it: server and token from the environment, the client's package
    alone on the path."""
    env = {**os.environ, "TESSERA_URL": url, "TESSERA_TOKEN": token, "PYTHONPATH": str(ROOT / "client")}
    return subprocess.run([sys.executable, "-m", "tessera_cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*.yaml"))}


def test_export_apply_into_a_fresh_install_rolls_the_fleet_to_the_same_state(tmp_path):
    first, second = _simulator().start(), None
    var = tmp_path / "var"
    var.mkdir()
    try:
        seed_demo()
        cluster = _register(first)
        _desired_state(cluster)
        _roll_out(first, cluster)
        rolled = _node_configs(first)
        mig_config = rolled[POOL_NODES[0]]["nvidia.com/mig.config"]
        assert [rolled[n]["nvidia.com/mig.config"] for n in POOL_NODES] == [mig_config] * 2
        assert Node.objects.get(name=POOL_NODES[0]).allocatable["nvidia.com/mig-1g.10gb"] == 56

        with web_server_process(var, eager_tasks=False) as (url, _):
            _, token = api_token_rotate(user=UserFactory(username="admin", role="admin"))
            exported = tmp_path / "fleet"
            done = _tessera(url, token, "export", str(exported))
            assert done.returncode == 0, done.stderr
            files = _files(exported)
            assert sum(path.startswith("pools/") for path in files) == 6  # the demo's 5 and h100
            assert {"profiles/mig-7.yaml", "qos-policies/serving.yaml", "schedules/sim/h100.yaml",
                    "kueue-bindings/sim/h100.yaml"} <= set(files)  # fmt: skip
            done = _tessera(url, token, "diff", "-f", str(exported), "--prune")
            assert (done.returncode, done.stdout.strip()) == (0, "No changes: the server matches the files."), done

            # A fresh install: nothing in the database; the clusters registered again and their inventory read.
            call_command("flush", interactive=False, verbosity=0)
            seed_demo()
            NodePool.objects.all().delete()  # the inventory, not the demo's pools: those come from the files
            second = _simulator().start()
            cluster = _register(second)
            _, token = api_token_rotate(user=UserFactory(username="admin", role="admin"))

            done = _tessera(url, token, "diff", "-f", str(exported))
            assert done.returncode == 2, done.stderr
            assert "+ Pool/sim/h100" in done.stdout and "Plan: 12 to create, 0 to update, 0 to delete." in done.stdout
            done = _tessera(url, token, "apply", "-f", str(exported), "-m", "restore from fleet-config@1a2b3c")
            assert done.returncode == 0, done.stderr
            (event,) = AuditEvent.objects.filter(action="config.apply")
            assert event.message == "restore from fleet-config@1a2b3c" and len(event.after["changes"]) > 10

            again = tmp_path / "again"
            assert _tessera(url, token, "export", str(again)).returncode == 0
            assert _files(again) == files
            assert _tessera(url, token, "diff", "-f", str(exported), "--prune").returncode == 0

        assert _node_configs(second) != rolled  # the seed's configs, before the reconcile loop runs
        _roll_out(second, cluster)
        assert _node_configs(second) == rolled
    finally:
        for sim in (first, second):
            if sim is not None:
                sim.stop()
