"""B3: switch 1,000 simulated H100 nodes to a new MIG profile through Tessera's rollout engine and Kubernetes driver.

Timed from the rollout's start to every node `succeeded` in Tessera (MIG Manager reported success and the
device plugin advertises the expected resources, read back from the API). The engine runs in-process: the
services the Celery tasks call (rollout_advance, node_changes_step over all in-flight changes) in a loop, one
rollout of 1,000 nodes with batch size 1,000 and no canary. Beside it:
  (a) `kubectl label node` in a shell-style loop, one process per node: a sample of 50 nodes, extrapolated to
      1,000 (the full loop takes minutes);
  (b) the floor: the same merge patches sent concurrently (16 threads) with the `kubernetes` client alone, then
      polling one node list until MIG Manager reports success everywhere.
Targets: Tessera ≤ 10 s, and ≥ 20× faster than the kubectl loop.

The simulator (apply delay 0, no workload pods) runs as a child process. Run: .venv/bin/python -m bench.b3_rollout
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bench.b_sync import Queries, k8s_core, sim_settle, simulator
from bench.common import setup_django, verdict

TARGET_S = 10.0
TARGET_RATIO = 20.0
H100 = "NVIDIA-H100-80GB-HBM3"
MERGE = "application/merge-patch+json"


def prepare(kubeconfig: str, url: str, count: int):
    """The cluster adopted and synced; a pool of `count` H100 nodes; a 7×1g.10gb profile on it; the rollout."""
    from config.celery import app
    from core.audit import Actor
    from fleet.models import Gpu, Node, NodePool
    from sharing import services as sharing_services
    from tests.factories import ClusterFactory
    from worker import reconcile
    from worker.drivers import driver_for
    from worker.inventory.cluster import sync_cluster_full
    from worker.models import Rollout

    # Tasks the services enqueue go to an in-memory queue nobody reads: this process drives the engine itself.
    app.conf.task_always_eager, app.conf.broker_url = False, "memory://"
    cluster = ClusterFactory(name="bench", kubeconfig_path=kubeconfig, metrics_url=f"{url}/metrics")
    driver_for(cluster).adopt_operator_configs()
    sim_settle(url, kubeconfig)  # every mig-manager restarted on the ClusterPolicy change: let that finish first
    sync_cluster_full(cluster, metrics=False)
    h100 = set(Gpu.objects.filter(product=H100, index=0).values_list("node__name", flat=True))
    names = sorted(
        n for n in Node.objects.filter(ready=True, unschedulable=False).values_list("name", flat=True) if n in h100
    )[:count]
    if len(names) < count:
        raise SystemExit(f"only {len(names)} ready H100 nodes; start more simulated nodes")
    pool = NodePool.objects.create(cluster=cluster, name="h100")
    Node.objects.filter(name__in=names).update(pool=pool)
    actor = Actor.system("bench")
    profile = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    (rollout_id,) = reconcile.reconcile()
    Rollout.objects.filter(pk=rollout_id).update(batch_size=count, canary_count=0, max_failures=count)
    return Rollout.objects.get(pk=rollout_id), names


def run_engine(rollout) -> tuple[float, int, int]:
    """The rollout driven as the tasks drive it, until it ends; returns (seconds, steps, queries)."""
    from config.celery import freeze_startup_heap
    from worker import services
    from worker.choices import IN_FLIGHT_STATUSES

    freeze_startup_heap()  # as a Celery worker process does once started
    queries, steps = Queries(), 0
    began = time.perf_counter()
    with queries.counting():
        while True:
            steps += 1
            started = services.rollout_advance(rollout.pk)
            active = list(rollout.changes.filter(status__in=IN_FLIGHT_STATUSES).values_list("pk", flat=True))
            if active or started:
                services.node_changes_step(sorted(set(started + active)))
            rollout.refresh_from_db()
            if rollout.status != "running":
                break
    return time.perf_counter() - began, steps, queries.count


def mig_states(core, names: set[str]) -> dict[str, str]:
    nodes = json.loads(core.list_node(label_selector="nvidia.com/gpu.present=true", _preload_content=False).data)
    return {
        n["metadata"]["name"]: n["metadata"]["labels"].get("nvidia.com/mig.config.state", "")
        for n in nodes["items"]
        if n["metadata"]["name"] in names
    }


def floor(kubeconfig: str, names: list[str], labels: dict) -> tuple[float, float]:
    """The same merge patches with the client alone, 16 at a time; then poll until MIG Manager says success."""
    core = k8s_core(kubeconfig)
    began = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: core.patch_node(n, {"metadata": {"labels": labels}}, _content_type=MERGE), names))
    sent = time.perf_counter() - began
    wanted = set(names)
    while set(mig_states(core, wanted).values()) != {"success"}:
        time.sleep(0.05)
    return sent, time.perf_counter() - began


def kubectl_loop(kubeconfig: str, names: list[str], cache_dir: str) -> float:
    """`for n in ...; do kubectl label node $n nvidia.com/mig.config=... --overwrite; done`, timed."""
    base = ["kubectl", "--kubeconfig", kubeconfig, "--cache-dir", cache_dir]
    subprocess.run([*base, "get", "nodes", "--request-timeout=30s", "-o", "name"], check=True, capture_output=True)
    began = time.perf_counter()
    for name in names:
        subprocess.run(
            [*base, "label", "node", name, "nvidia.com/mig.config=all-balanced", "--overwrite"],
            check=True,
            capture_output=True,
        )
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1_000, help="nodes to switch (H100s of the simulated fleet)")
    parser.add_argument("--fleet", type=int, default=2_600, help="simulated nodes (40 %% are H100)")
    parser.add_argument("--kubectl-sample", type=int, default=50)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="tessera-bench-")
    connection, old_name = setup_django(scratch, "b3_rollout")
    try:
        with simulator(args.fleet, workload_pods=0, apply_delay=0.0) as (url, kubeconfig, _):
            rollout, names = prepare(kubeconfig, url, args.nodes)
            seconds, steps, queries = run_engine(rollout)
            from django.db.models import Count

            statuses = dict(rollout.changes.values_list("status").annotate(n=Count("pk")))
            core = k8s_core(kubeconfig)
            states = mig_states(core, set(names))
            change = rollout.changes.first()
            ok_nodes = statuses == {"succeeded": len(names)} and set(states.values()) == {"success"}

            sim_settle(url, kubeconfig)
            sent, until_success = floor(
                kubeconfig,
                names,
                {
                    "nvidia.com/mig.config": "all-disabled",
                    "nvidia.com/device-plugin.config": change.to_config["device_plugin_config"],
                    "tessera.io/managed": "true",
                },
            )
            sim_settle(url, kubeconfig)
            sample = names[: args.kubectl_sample]
            kubectl_s = kubectl_loop(kubeconfig, sample, f"{scratch}/kube-cache")
            kubectl_total = kubectl_s * len(names) / len(sample)

        print(f"simulated fleet {args.fleet} nodes (child process, apply delay 0); {len(names)} H100 nodes switched")
        print(
            f"Tessera rollout (engine in-process, batch {len(names)}, no canary): {seconds:.2f} s to every node "
            f"succeeded, {steps} engine passes, {queries} queries; outcome {statuses}"
        )
        print(f"floor, the same merge patches with the kubernetes client (16 threads): sent in {sent:.2f} s, "
              f"MIG Manager success everywhere after {until_success:.2f} s")  # fmt: skip
        print(
            f"kubectl label loop: {kubectl_s:.1f} s for {len(sample)} nodes ({kubectl_s / len(sample) * 1000:.0f} ms "
            f"each) -> ~{kubectl_total:.0f} s for {len(names)} (extrapolated from the sample)"
        )
        ratio_floor = seconds / until_success
        ratio_kubectl = kubectl_total / seconds
        print(f"Tessera / floor = {ratio_floor:.2f}x   kubectl loop / Tessera = {ratio_kubectl:.1f}x")
        passed = ok_nodes and seconds <= TARGET_S and ratio_kubectl >= TARGET_RATIO
        print(
            f"targets: <= {TARGET_S:.0f} s {verdict(seconds <= TARGET_S)}, >= {TARGET_RATIO:.0f}x faster than "
            f"kubectl {verdict(ratio_kubectl >= TARGET_RATIO)}, every node succeeded {verdict(ok_nodes)}"
        )
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
