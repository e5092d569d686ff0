"""B4: one reconcile tick's desired-state evaluation for 10,000 nodes in 500 pools, every pool on a schedule.

Run: .venv/bin/python -m bench.b4_schedule_eval [--nodes 10000 --pools 500] [--quick]
Prints the time per tick at N and at N/2 nodes (growth should be linear: ratio ≈ 2) and the query count.
Target: at most 1 s per tick at 10,000 nodes.
"""

import argparse
import sys
import tempfile
from datetime import UTC, datetime, time

from bench.common import median_seconds, setup_django, verdict

MAX_SECONDS = 1.0


def seed(nodes: int, pools: int):
    from fleet.models import Cluster, Gpu, Node, NodePool
    from scheduling.models import Schedule, ScheduleWindow
    from sharing.models import PoolSharing, SharingProfile

    cluster = Cluster.objects.create(name="bench", driver="agent")
    day = SharingProfile.objects.create(
        name="day", mode="mig", target_products=["NVIDIA-H100-80GB-HBM3"], mig_layouts={"all": {"1g.10gb": 7}}
    )
    night = SharingProfile.objects.create(name="night", mode="passthrough", target_products=["NVIDIA-H100-80GB-HBM3"])
    pool_rows = NodePool.objects.bulk_create([NodePool(cluster=cluster, name=f"p{i:03d}") for i in range(pools)])
    PoolSharing.objects.bulk_create([PoolSharing(pool=p, profile=night) for p in pool_rows])
    zones = ["Europe/Berlin", "America/New_York", "Asia/Tokyo", "UTC"]
    schedules = Schedule.objects.bulk_create(
        [
            Schedule(pool=p, name=f"s{i}", time_zone=zones[i % 4], baseline_profile=night)
            for i, p in enumerate(pool_rows)
        ]
    )
    ScheduleWindow.objects.bulk_create(
        [
            ScheduleWindow(schedule=s, name="day", weekdays=[0, 1, 2, 3, 4], start=time(8), end=time(20), profile=day)
            for s in schedules
        ]
    )
    node_rows = Node.objects.bulk_create(
        [Node(cluster=cluster, pool=pool_rows[i % pools], name=f"n{i:05d}") for i in range(nodes)], batch_size=2000
    )
    Gpu.objects.bulk_create(
        [
            Gpu(node=n, index=g, uuid=f"GPU-{n.pk}-{g}", product="NVIDIA-H100-80GB-HBM3", mig_capable=True)
            for n in node_rows
            for g in range(8)
        ],
        batch_size=5000,
    )


def tick(limit: int | None = None):
    """What the reconcile loop computes per tick: desired vs observed for every reconcilable node."""
    from fleet.models import Node
    from scheduling.selectors import desired_vs_observed
    from worker.selectors import reconcilable_nodes

    queryset = Node.objects.all()
    if limit:
        queryset = queryset.filter(pk__lte=Node.objects.order_by("pk").values_list("pk", flat=True)[limit - 1])
    nodes = reconcilable_nodes(queryset)
    return desired_vs_observed(nodes, at=datetime(2026, 11, 23, 10, 0, tzinfo=UTC))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pools", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smoke test: 1,000 nodes, 50 pools")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pools = 1000, 50
    with tempfile.TemporaryDirectory() as scratch:
        connection, old_name = setup_django(scratch, "b4")
        try:
            from django.db import reset_queries
            from django.test.utils import CaptureQueriesContext
            from django.utils import timezone

            from fleet.models import Node

            seed(args.nodes, args.pools)
            Node.objects.update(last_seen_at=timezone.now())  # fresh, whenever the benchmark runs

            rows = tick()
            # 10:00 UTC on a Monday: day in Berlin and Tokyo, night in New York (05:00), day in UTC.
            expected = {"Europe/Berlin": "day", "Asia/Tokyo": "day", "America/New_York": "night", "UTC": "day"}
            wrong = [r for r in rows if r.profile.name != expected[r.schedule.time_zone]]
            assert len(rows) == args.nodes and not wrong, f"evaluation is wrong for {len(wrong)} nodes"
            full = median_seconds(tick, args.runs, warmup=1)
            half = median_seconds(lambda: tick(args.nodes // 2), args.runs, warmup=1)
            reset_queries()
            with CaptureQueriesContext(connection) as queries:
                tick()
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    ok = full <= MAX_SECONDS
    print(f"B4 schedule evaluation: {args.nodes} nodes in {args.pools} pools")
    print(f"  tick at {args.nodes} nodes: {full * 1000:.0f} ms ({len(queries)} queries)")
    print(f"  tick at {args.nodes // 2} nodes: {half * 1000:.0f} ms; growth ratio {full / half:.2f} (linear ≈ 2)")
    print(f"  target ≤ {MAX_SECONDS * 1000:.0f} ms per tick: {verdict(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
