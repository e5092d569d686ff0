"""B-sync: Tessera's inventory from a 10,000-node simulated cluster.

1. The first full sync: list every GPU node (paginated) and scrape dcgm-exporter, then record nodes, GPUs, MIG
   devices and metrics (worker.inventory.cluster.sync_cluster_full) into an empty database. Target: ≤ 60 s.
2. Incremental updates through the watch path (worker.inventory.watch.ClusterWatcher): N nodes change a label, each
   change arrives as a watch event and is recorded in batches. Printed for 100 and 1,000 changed nodes: the
   cost (recording time, queries) must grow with the changed nodes, not with the fleet.

3. With --dra, the DRA variant instead (issue 26): the first sync of nodes and their GPUs (no dcgm-exporter) of a fleet
   whose every node runs NVIDIA's DRA driver (ResourceSlices listed, GPUs and MIG devices recorded from them), against
   the Node-only sync of the same fleet measured in the same run (a device-plugin fleet, nodes alone). Target: ≤ 1.5×.

The simulator runs as a child process (`python -m simulator`), so it does not share Tessera's GIL.

Run: .venv/bin/python -m bench.b_sync [--nodes 10000] [--quick] [--dra]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from bench.common import setup_django, verdict

ROOT = Path(__file__).resolve().parents[1]
FULL_SYNC_TARGET_S = 60.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def simulator(
    nodes: int, *, workload_pods: int | None = None, apply_delay: float = 0.0, seed: int = 7, dra: str = "none"
):
    """`python -m simulator` in a child process; yields (url, kubeconfig path, state dir)."""
    state = Path(tempfile.mkdtemp(prefix="tessera-bench-sim-"))
    port = _free_port()
    # --save-interval 0: a fresh fleet every time, and no state file written alongside the timed syncs.
    cmd = [sys.executable, "-m", "simulator", "--port", str(port), "--nodes", str(nodes), "--seed", str(seed),
           "--apply-delay", str(apply_delay), "--state-dir", str(state), "--save-interval", "0",
           "--write-kubeconfig", str(state / "kubeconfig")]  # fmt: skip
    if workload_pods is not None:
        cmd += ["--workload-pods", str(workload_pods)]
    cmd += ["--dra-nodes", dra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the simulator exited with {proc.returncode}")
            try:
                context = ssl.create_default_context(cafile=str(state / "apiserver.crt"))
                with urllib.request.urlopen(url + "/healthz", timeout=2, context=context):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url, str(state / "kubeconfig"), state
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(state, ignore_errors=True)


class Queries:
    """Counts the SQL statements of the current thread's connection (DEBUG stays off)."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)

    @contextmanager
    def counting(self):
        from django.db import connection

        with connection.execute_wrapper(self):
            yield self


def first_sync(cluster) -> tuple[float, int, object]:
    """Nodes listed, dcgm-exporter scraped, nodes + GPUs + MIG devices recorded (utilisation: see metrics_record)."""
    from worker.inventory.cluster import sync_cluster_full

    queries = Queries()
    began = time.perf_counter()
    with queries.counting():
        result = sync_cluster_full(cluster, metrics=False)
    return time.perf_counter() - began, queries.count, result


def metrics_record(cluster, sample_gpus: int) -> tuple[float, int, int, float]:
    """fleet.services.gpu_metrics_record (the fleet app's service) on the first `sample_gpus` scraped GPUs; its
    bulk_update costs milliseconds per GPU, so the whole fleet is extrapolated from the sample."""
    from fleet.services import gpu_metrics_record
    from worker.inventory.dcgm import gpu_metrics
    from worker.inventory.exporters import fetch_metrics

    began = time.perf_counter()
    samples = gpu_metrics(fetch_metrics(cluster))
    fetch = time.perf_counter() - began
    queries = Queries()
    began = time.perf_counter()
    with queries.counting():
        gpu_metrics_record(samples=samples[:sample_gpus])
    return time.perf_counter() - began, queries.count, len(samples), fetch


def incremental(cluster, kubeconfig: str, names: list[str], round_no: int) -> dict:
    """`names` change a label through the API; a watcher started from the version before the changes (as after a
    reconnect) records them. Timed from the watcher's start until every change is in the database, with the
    recording (the batched inventory_record calls) and its queries counted on their own."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from fleet.models import Node
    from worker.inventory.watch import ClusterWatcher

    flushes = []

    class Measured(ClusterWatcher):
        def _flush(self, pending):
            if not pending:
                return
            queries, began, size = Queries(), time.perf_counter(), len(pending)
            with queries.counting():
                super()._flush(pending)
            flushes.append((size, time.perf_counter() - began, queries.count))

    version = _current_version(kubeconfig)
    core = k8s_core(kubeconfig)
    value = f"r{round_no}"
    began = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        body = {"metadata": {"labels": {"tessera.io/bench": value}}}
        list(pool.map(lambda n: core.patch_node(n, body, _content_type="application/merge-patch+json"), names))
    sent = time.perf_counter() - began

    watcher = Measured(cluster, gpus_on_start=False, watch_seconds=120)
    watcher.version = version
    thread = threading.Thread(target=watcher.run, daemon=True)
    began = time.perf_counter()
    thread.start()
    key = "labels__tessera.io/bench"  # a JSON key lookup works on SQLite and PostgreSQL alike
    while Node.objects.filter(name__in=names, **{key: value}).count() < len(names):
        time.sleep(0.1)
    total = time.perf_counter() - began
    watcher.stop()
    thread.join(10)
    connection.close()
    return {
        "nodes": len(names),
        "patch_s": sent,
        "until_recorded_s": total,
        "record_s": sum(f[1] for f in flushes),
        "queries": sum(f[2] for f in flushes),
        "batches": len(flushes),
        "events": watcher.stats.events,
    }


def k8s_core(kubeconfig: str, threads: int = 16):
    """The official client alone, with a connection per thread."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = threads
    return client.CoreV1Api(client.ApiClient(configuration))


def sim_settle(url: str, kubeconfig: str, timeout: float = 120) -> bool:
    """POST /_sim/settle: wait until the simulated operator has nothing queued (its control endpoint)."""
    api = k8s_core(kubeconfig).api_client
    reply = api.rest_client.pool_manager.request(
        "POST",
        f"{url}/_sim/settle?timeout={timeout:g}",
        headers={"Authorization": api.configuration.get_api_key_with_prefix("BearerToken")},
        timeout=timeout + 10,
    )
    return json.loads(reply.data)["settled"]


def _current_version(kubeconfig: str) -> str:
    response = k8s_core(kubeconfig).list_node(limit=1, _preload_content=False)
    return json.loads(response.data)["metadata"]["resourceVersion"]


DRA_SYNC_RATIO = 1.5


def dra_variant(nodes: int) -> bool:
    """The first sync of a fleet served by the DRA driver (slices read, GPUs and MIG devices recorded from them)
    against the Node-only first sync of a device-plugin fleet of the same size (and, for reference, that fleet's
    sync with its GPUs from dcgm-exporter), each into an empty database."""
    from django.db import connection

    from fleet.models import Gpu, MigDevice, Node
    from tests.factories import ClusterFactory
    from worker.inventory.cluster import sync_cluster_full

    timings = {}
    runs = (("node-only", "none", False), ("device-plugin with GPUs", "none", True), ("dra", "all", False))
    for name, dra, gpus in runs:
        with simulator(nodes, workload_pods=0, dra=dra) as (url, kubeconfig, _):
            cluster = ClusterFactory(name=f"bench-{name}", kubeconfig_path=kubeconfig, metrics_url=f"{url}/metrics")
            queries = Queries()
            began = time.perf_counter()
            with queries.counting():
                sync_cluster_full(cluster, gpus=gpus, metrics=False)
            timings[name] = time.perf_counter() - began
            live = Node.objects.filter(cluster=cluster)
            counts = (live.count(), Gpu.objects.filter(node__cluster=cluster).count(),
                      MigDevice.objects.filter(gpu__node__cluster=cluster).count())  # fmt: skip
            print(
                f"{name} first sync: {timings[name]:.1f} s, {queries.count} queries -> {counts[0]} nodes, "
                f"{counts[1]} GPUs, {counts[2]} MIG devices"
            )
        connection.close()
    ratio = timings["dra"] / timings["node-only"]
    ok = ratio <= DRA_SYNC_RATIO
    print(f"DRA first sync / Node-only first sync: x{ratio:.2f}   target <= x{DRA_SYNC_RATIO} {verdict(ok)}")
    with_gpus = timings["dra"] / timings["device-plugin with GPUs"]
    print(f"DRA first sync / device-plugin first sync with dcgm-exporter GPUs: x{with_gpus:.2f} (for reference)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, 10 and 100 changed nodes")
    parser.add_argument("--dra", action="store_true", help="the DRA variant: first sync against the Node-only one")
    args = parser.parse_args()
    nodes = 1_000 if args.quick else args.nodes
    if args.dra:
        scratch = tempfile.mkdtemp(prefix="tessera-bench-")
        connection, old_name = setup_django(scratch, "b_sync_dra")
        try:
            return 0 if dra_variant(nodes) else 1
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)
            shutil.rmtree(scratch, ignore_errors=True)
    small, large = (10, 100) if args.quick else (100, 1_000)

    scratch = tempfile.mkdtemp(prefix="tessera-bench-")
    connection, old_name = setup_django(scratch, "b_sync")
    try:
        from fleet.models import Cluster, Gpu, MigDevice, Node
        from tests.factories import ClusterFactory

        with simulator(nodes) as (url, kubeconfig, _):
            cluster = ClusterFactory(name="bench", kubeconfig_path=kubeconfig, metrics_url=f"{url}/metrics")
            seconds, queries, result = first_sync(cluster)
            counts = (Node.objects.count(), Gpu.objects.count(), MigDevice.objects.count())
            print(f"simulator: {nodes} nodes (child process), SQLite scratch database, {os.cpu_count()} CPUs")
            print(
                f"first full sync: {seconds:.1f} s, {queries} queries -> {counts[0]} nodes, {counts[1]} GPUs, "
                f"{counts[2]} MIG devices   target <= {FULL_SYNC_TARGET_S:.0f} s "
                f"{verdict(seconds <= FULL_SYNC_TARGET_S)}"
            )
            again_s, again_q, again = first_sync(Cluster.objects.get(pk=cluster.pk))
            print(
                f"second full sync (nothing changed): {again_s:.1f} s, {again_q} queries, "
                f"changed={again.changed.changed}"
            )
            sample = min(counts[1], 5_000)
            record_s, record_q, total_gpus, fetch_s = metrics_record(cluster, sample)
            print(
                f"utilisation: scrape + parse of {total_gpus} GPUs {fetch_s:.1f} s; fleet.services.gpu_metrics_record "
                f"{record_s:.1f} s / {record_q} queries for {sample} GPUs -> ~{record_s * total_gpus / sample:.0f} s "
                f"for all (extrapolated; Django bulk_update, see bench/README.md)"
            )

            names = list(Node.objects.order_by("name").values_list("name", flat=True))
            rows = []
            for round_no, size in enumerate((small, large), start=1):
                rows.append(incremental(Cluster.objects.get(pk=cluster.pk), kubeconfig, names[:size], round_no))
            for row in rows:
                print(
                    f"watch path, {row['nodes']:>5} changed nodes: all recorded {row['until_recorded_s']:.2f} s after "
                    f"the watch started ({row['events']} events); recording {row['record_s']:.3f} s in "
                    f"{row['batches']} batch(es), {row['queries']} queries   (the {row['nodes']} patches: "
                    f"{row['patch_s']:.2f} s)"
                )
            per_small = rows[0]["record_s"] / rows[0]["nodes"]
            per_large = rows[1]["record_s"] / rows[1]["nodes"]
            ratio_q = rows[1]["queries"] / max(1, rows[0]["queries"])
            ratio_t = rows[1]["record_s"] / max(1e-9, rows[0]["record_s"])
            # Proportional: ten times the nodes costs about ten times (not the fleet's size); 2x slack for noise.
            proportional = ratio_t <= (large / small) * 2 and ratio_q <= large / small
            print(
                f"growth {small} -> {large} changed nodes: recording time x{ratio_t:.1f}, queries x{ratio_q:.1f} "
                f"(x{large // small} nodes; per node {per_small * 1000:.2f} -> {per_large * 1000:.2f} ms)   "
                f"proportional to changed nodes {verdict(proportional)}"
            )
            ok = seconds <= FULL_SYNC_TARGET_S and proportional
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
