"""B1: `GET /api/v1/gpus/?page_size=500` on a 10,000-node / 80,000-GPU fleet, beside a raw-SQL floor of the same rows.

Run: .venv/bin/python -m bench.b1_gpu_list [--nodes 10000 --gpus-per-node 8] [--runs 25] [--quick]
Targets: the API's median latency at most 3x the floor's, and at most 8 queries per request.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta

from bench.common import setup_django, verdict

MAX_RATIO = 3.0
MAX_QUERIES = 8
PAGE_SIZE = 500
URL = f"/api/v1/gpus/?page_size={PAGE_SIZE}"
MIG_LAYOUT = (("3g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1))
MIG_EVERY = 5  # one node in five runs MIG on all its GPUs


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--runs", type=int, default=25, help="measured runs after warm-up (at least 20)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 200 nodes, 5 runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.runs = 200, 5
    elif args.runs < 20:
        parser.error("--runs must be at least 20 (use --quick for a smoke test)")
    return args


def seed(nodes, gpus_per_node, start=0):
    """Bulk-create the fleet: 2 clusters, 20 pools (one node in 21 in none), MIG layouts on one node in five.

    With `start`, add nodes `start` .. `nodes - 1` to the fleet an earlier call made (B5 grows it in place)."""
    from django.utils import timezone

    from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool

    now = timezone.now()
    if start:
        clusters, pools = list(Cluster.objects.order_by("name")), list(NodePool.objects.order_by("name"))
    else:
        clusters = Cluster.objects.bulk_create(
            [Cluster(name=f"bench-{i}", driver="agent", connection_state="ok", last_contact_at=now) for i in range(2)]
        )
        pools = NodePool.objects.bulk_create(
            [NodePool(cluster=clusters[i % 2], name=f"pool-{i:02d}") for i in range(20)]
        )
    node_rows = []
    for i in range(start, nodes):
        pool = pools[i % 21] if i % 21 < 20 else None
        node_rows.append(
            Node(
                cluster=clusters[i % 2] if pool is None else pool.cluster,
                pool=pool,
                name=f"gpu-node-{i:05d}",
                ready=True,
                observed_mode="mig" if i % MIG_EVERY == 0 else "time_slicing",
                config_state="success",
                last_seen_at=now - timedelta(seconds=i % 300),
                driver_version="570.133.20",
                cuda_version="12.8",
            )
        )
    node_rows = Node.objects.bulk_create(node_rows, batch_size=2000)
    gpu_rows = []
    for i, node in enumerate(node_rows, start):
        for index in range(gpus_per_node):
            gpu_rows.append(
                Gpu(
                    node=node,
                    index=index,
                    uuid=f"GPU-{i:05d}{index:03d}-0000-4000-8000-000000000000",
                    product="NVIDIA-H100-80GB-HBM3" if i % 3 else "NVIDIA-A100-SXM4-80GB",
                    memory_mib=81559,
                    pci_bus_id=f"00000000:{index * 16 + 0x1B:02X}:00.0",
                    mig_capable=True,
                    mig_enabled=i % MIG_EVERY == 0,
                    health="healthy" if (i + index) % 97 else "degraded",
                    utilization_pct=float((i * 7 + index * 13) % 101),
                    memory_used_mib=(i * 997 + index) % 81559,
                    temperature_c=40.0 + (i + index) % 40,
                    power_w=100.0 + (i * 3 + index) % 500,
                    metrics_at=now,
                )
            )
    gpu_rows = Gpu.objects.bulk_create(gpu_rows, batch_size=2000)
    mig_rows = [
        MigDevice(
            gpu=gpu,
            profile=profile,
            start=start,
            size=size,
            uuid=f"MIG-{gpu.uuid[4:12]}-{start}",
            memory_mib=size * 9984,
            in_use_by=f"ml/job-{gpu.pk}" if start == 0 else "",
        )
        for gpu in gpu_rows
        if gpu.mig_enabled
        for profile, start, size in MIG_LAYOUT
    ]
    MigDevice.objects.bulk_create(mig_rows, batch_size=2000)
    return len(node_rows), len(gpu_rows), len(mig_rows)


def floor_sql(connection):
    """The same page (columns, joined names, MIG devices, order) as one query, built from the API's own column list."""
    from fleet.api.serializers import GPU_COLUMNS, GPU_MIG_DEVICE_COLUMNS
    from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool

    q = connection.ops.quote_name
    gpu_columns = ", ".join(f"g.{q(c)} AS {q(c)}" for c in ("id", *GPU_COLUMNS))
    mig_columns = ", ".join(f"m.{q(c)}" for c in GPU_MIG_DEVICE_COLUMNS)
    return f"""
        SELECT page.*, {mig_columns}
        FROM (
            SELECT {gpu_columns}, n.id AS node_id, n.name AS node_name, c.id AS cluster_id, c.name AS cluster_name,
                   p.id AS pool_id, p.name AS pool_name
            FROM {q(Gpu._meta.db_table)} g
            JOIN {q(Node._meta.db_table)} n ON n.id = g.node_id
            JOIN {q(Cluster._meta.db_table)} c ON c.id = n.cluster_id
            LEFT JOIN {q(NodePool._meta.db_table)} p ON p.id = n.pool_id
            WHERE g.gone_at IS NULL
            ORDER BY n.name, g.{q("index")}
            LIMIT {PAGE_SIZE}
        ) page
        LEFT JOIN {q(MigDevice._meta.db_table)} m ON m.gpu_id = page.id
        ORDER BY page.node_name, page.{q("index")}, m.start
    """


def floor_request(connection, sql):
    """One raw query, rows folded into GPU dicts with their MIG devices, and json.dumps: the floor."""
    from fleet.api.serializers import GPU_MIG_DEVICE_COLUMNS

    with connection.cursor() as cursor:
        cursor.execute(sql)
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    width = len(names) - len(GPU_MIG_DEVICE_COLUMNS)
    gpu_names, mig_names = names[:width], GPU_MIG_DEVICE_COLUMNS
    gpus, by_id = [], {}
    for row in rows:
        gpu = by_id.get(row[0])
        if gpu is None:
            gpu = by_id[row[0]] = dict(zip(gpu_names, row[:width], strict=True))
            gpu["mig_devices"] = []
            gpus.append(gpu)
        if row[width] is not None:
            gpu["mig_devices"].append(dict(zip(mig_names, row[width:], strict=True)))
    return json.dumps({"results": gpus}, default=str).encode(), [g["id"] for g in gpus]


def timed_ms(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-b1-") as scratch_dir:
        connection, old_name = setup_django(scratch_dir, "b1")
        try:
            return run(args, connection)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)


def run(args, connection):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from core.services import api_token_rotate

    setup_test_environment()  # the test client's host is allowed whichever settings `make bench` exports
    started = time.perf_counter()
    nodes, gpus, mig_devices = seed(args.nodes, args.gpus_per_node)
    seeded = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    user = get_user_model().objects.create(username="bench")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client(headers={"Authorization": f"Token {api_token_rotate(user=user)[1]}"})
    sql = floor_sql(connection)

    def api_request():
        response = client.get(URL)
        assert response.status_code == 200, response.content[:300]
        return response

    page = json.loads(api_request().content)["results"]
    _, floor_ids = floor_request(connection, sql)
    assert [g["id"] for g in page] == floor_ids, "the API and the floor must return the same rows"
    with CaptureQueriesContext(connection) as captured:
        api_request()
    queries = len(captured)  # now: the next request's start clears the log
    for _ in range(3):  # warm-up
        api_request()
        floor_request(connection, sql)

    api_times, floor_times = [], []
    for _ in range(args.runs):  # interleaved, so drift hits both alike
        api_times.append(timed_ms(api_request))
        floor_times.append(timed_ms(lambda: floor_request(connection, sql)))
    api_ms, floor_ms = statistics.median(api_times), statistics.median(floor_times)
    ratio = api_ms / floor_ms
    ok_ratio, ok_queries = ratio <= MAX_RATIO, queries <= MAX_QUERIES

    print(
        f"B1 GET {URL}: {nodes} nodes, {gpus} GPUs, {mig_devices} MIG devices on {connection.vendor} "
        f"(seeded in {seeded:.1f} s), median of {args.runs} runs"
    )
    print(f"  api    {api_ms:8.2f} ms  ({len(page)} rows, {queries} queries, token auth, Django test client)")
    print(f"  floor  {floor_ms:8.2f} ms  (one raw SQL query + json.dumps, same rows and columns)")
    print(f"  ratio  {ratio:8.2f} x   target <= {MAX_RATIO:g}x   {verdict(ok_ratio)}")
    print(f"  queries {queries:7d}     target <= {MAX_QUERIES}    {verdict(ok_queries)}")
    return 0 if ok_ratio and ok_queries else 1


if __name__ == "__main__":
    sys.exit(main())
