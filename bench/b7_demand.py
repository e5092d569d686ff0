"""B7: a pool's week of demand out of a fleet's recorded history — the query the capacity page and the
recommendation read — with 10,000 nodes' worth of samples.

Run: .venv/bin/python -m bench.b7_demand [--nodes 10000 --nodes-per-pool 100 --days 7] [--quick]
Seeds DemandSample rows for every pool (6 resources, both sources on one of them) every 5 minutes over `--days`,
plus a week before it (what the retention keeps, so the index has to skip it), then times `week_demand` for one pool
against a floor: the same rows read by one raw SQL query without aggregation. Also prints the replay of the
recommendation for that pool (weekdays 08–20) for information.
Target: the week query ≤ 0.5 s and ≤ 4 × the floor.
"""

import argparse
import sys
import tempfile
from datetime import UTC, datetime, timedelta

from bench.common import median_seconds, setup_django, verdict

MAX_SECONDS = 0.5
MAX_RATIO = 4.0  # the ORM turns each SQLite `at` text into an aware datetime; the floor keeps the text
RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb",
             "nvidia.com/mig-4g.40gb", "nvidia.com/mig-7g.80gb")  # fmt: skip
END = datetime(2025, 3, 10, tzinfo=UTC)


def seed(pools: int, days: int, step_minutes: int = 5) -> int:
    from django.db import connection, transaction

    from capacity.models import DemandSample
    from fleet.models import Cluster, NodePool

    cluster = Cluster.objects.create(name="bench", driver="agent")
    rows = NodePool.objects.bulk_create([NodePool(cluster=cluster, name=f"p{i:03d}") for i in range(pools)])
    table = DemandSample._meta.db_table
    columns = ("pool_id", "at", "seconds", "source", "resource", "capacity", "used", "used_gpus", "gpu_share",
               "pending", "pending_units", "pending_wait_max_s", "arrived", "arrived_units", "started",
               "started_within_5min", "started_wait_s")  # fmt: skip
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
    start = END - timedelta(days=days)
    instants = [start + timedelta(minutes=step_minutes * i) for i in range(days * 24 * 60 // step_minutes)]
    total = 0
    with connection.cursor() as cursor:
        for pool in rows:
            batch = []
            for k, at in enumerate(instants):
                stamp = connection.ops.adapt_datetimefield_value(at)
                for r, resource in enumerate(RESOURCES):
                    busy = (k + r) % 7
                    batch.append((pool.pk, stamp, 60 * step_minutes, "pods", resource, 56, busy * 8, busy * 8.0, 1.0,
                                  busy, busy, 60 * busy, busy % 3, busy % 3, busy % 2, busy % 2, 30.0))  # fmt: skip
                if k % 12 == 0:
                    batch.append((pool.pk, stamp, 60 * step_minutes, "workloads", RESOURCES[0], 0, 0, 0.0, 1.0,
                                  2, 16, 600, 1, 8, 0, 0, 0.0))  # fmt: skip
            with transaction.atomic():
                cursor.executemany(sql, batch)
            total += len(batch)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--nodes-per-pool", type=int, default=100)
    parser.add_argument("--days", type=int, default=14, help="history seeded: the week asked for and one before")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="smoke test: 1,000 nodes, 5 runs")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.runs = 1_000, 5
    pools = max(1, args.nodes // args.nodes_per_pool)

    with tempfile.TemporaryDirectory() as scratch:
        connection, old_name = setup_django(scratch, "b7")
        try:
            import time

            from capacity import selectors
            from fleet.models import NodePool

            clock = time.perf_counter()
            rows = seed(pools, args.days)
            seeded = time.perf_counter() - clock
            with connection.cursor() as cursor:
                if connection.vendor == "sqlite":
                    cursor.execute("ANALYZE")
                else:
                    cursor.execute("ANALYZE capacity_demandsample")
            pool = NodePool.objects.order_by("pk")[pools // 2]
            week = selectors.week_demand(pool, END)
            query = median_seconds(lambda: selectors.week_demand(pool, END), args.runs)
            start = connection.ops.adapt_datetimefield_value(END - selectors.WEEK)
            end = connection.ops.adapt_datetimefield_value(END)

            def floor():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT at, resource, seconds, gpu_share, capacity, used, used_gpus, pending, pending_units, "
                        "arrived, arrived_units, started_within_5min FROM capacity_demandsample "
                        "WHERE pool_id = %s AND at >= %s AND at < %s",
                        [pool.pk, start, end],
                    )
                    return cursor.fetchall()

            floor_rows = len(floor())
            floor_s = median_seconds(floor, args.runs)
            clock = time.perf_counter()
            result = selectors.recommendation(pool, selectors.Window(), week)
            replay = time.perf_counter() - clock
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    ratio = query / floor_s if floor_s else float("inf")
    ok = query <= MAX_SECONDS and ratio <= MAX_RATIO
    print(
        f"B7 week of demand: {args.nodes} nodes in {pools} pools, {rows} samples over {args.days} days on "
        f"{connection.vendor} (seeded in {seeded:.1f} s), median of {args.runs} runs\n"
        f"  week query {query * 1000:8.1f} ms  ({len(week)} instants, {floor_rows} rows, selectors.week_demand)\n"
        f"  floor      {floor_s * 1000:8.1f} ms  (the same rows and columns, one raw SQL query, tuples)\n"
        f"  ratio      {ratio:8.2f} x\n"
        f"  replay     {replay * 1000:8.1f} ms  ({len(result.outcomes)} candidates; the pool has no GPUs here, so "
        f"whole GPUs only: information)\n"
        f"  target week query <= {MAX_SECONDS} s and <= {MAX_RATIO} x floor   {verdict(ok)}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
