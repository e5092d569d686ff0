"""B4: the reconcile tick's desired-state evaluation, incremental (worker/reconcile.py) and full, pools on schedules.

Run: .venv/bin/python -m bench.b4_schedule_eval [--nodes 10000 --pools 500 --flip 1000] [--quick]
Seeds a fleet in sync with its schedules, then times, each run checked to have evaluated exactly the nodes it should:
  - a tick when nothing changed (target ≤ 2 s at 100,000 nodes),
  - a tick when a schedule window ends for the pools of `--flip` nodes (target ≤ 5 s for 10,000 at 100,000 nodes),
  - the full pass (the safety net) at N and N/2 nodes (growth ratio; the old B4 target, ≤ 1 s at 10,000 nodes).
Each beside a floor: the rows the answer depends on, read with raw SQL.
"""

import argparse
import sys
import tempfile
import time as clock
from datetime import UTC, datetime, time, timedelta

from bench.common import median_seconds, setup_django, verdict

QUIET_SECONDS, FLIP_SECONDS, FULL_SECONDS_PER_10K = 2.0, 5.0, 1.0
# Monday 2026-11-23: at 10:00 UTC no pool crosses a boundary; at 11:00 UTC (20:00 in Tokyo) the Tokyo pools' day ends.
QUIET_AT = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
FLIP_AT = datetime(2026, 11, 23, 11, 0, 30, tzinfo=UTC)
ZONES = ["Europe/Berlin", "America/New_York", "UTC"]  # none crosses 08:00 or 20:00 local between 09:59 and 11:01 UTC


def seed(nodes: int, pools: int, flip_pools: int):
    """Pools on a day/night schedule (the first `flip_pools` in Tokyo, the others in zones without a boundary near the
    instants timed), nodes of 8 H100s on an agent cluster, each running what its schedule asks at QUIET_AT."""
    from fleet.models import Cluster, Node, NodePool
    from scheduling.models import Schedule, ScheduleWindow
    from sharing.models import PoolSharing, SharingProfile

    cluster = Cluster.objects.create(name="bench", driver="agent")
    day = SharingProfile.objects.create(
        name="day", mode="mig", target_products=["NVIDIA-H100-80GB-HBM3"], mig_layouts={"all": {"1g.10gb": 7}}
    )
    night = SharingProfile.objects.create(name="night", mode="passthrough", target_products=["NVIDIA-H100-80GB-HBM3"])
    pool_rows = NodePool.objects.bulk_create([NodePool(cluster=cluster, name=f"p{i:04d}") for i in range(pools)])
    PoolSharing.objects.bulk_create([PoolSharing(pool=p, profile=night) for p in pool_rows])
    schedules = Schedule.objects.bulk_create(
        [
            Schedule(
                pool=p, name=f"s{i}", time_zone="Asia/Tokyo" if i < flip_pools else ZONES[i % 3], baseline_profile=night
            )
            for i, p in enumerate(pool_rows)
        ]
    )
    # Calendars as distinct as a real fleet's (a process plans each distinct one once): the day starts at 08:mm;
    # outside Tokyo it ends at 20:mm as well (no boundary near the instants timed), in Tokyo at 20:00 sharp.
    ScheduleWindow.objects.bulk_create(
        [
            ScheduleWindow(
                schedule=s,
                name="day",
                weekdays=[0, 1, 2, 3, 4],
                start=time(8, i % 60),
                end=time(20, 0 if i < flip_pools else (i // 60) % 60),
                profile=day,
            )
            for i, s in enumerate(schedules)
        ]
    )
    node_rows = Node.objects.bulk_create(
        [Node(cluster=cluster, pool=pool_rows[i % pools], name=f"n{i:06d}", ready=True) for i in range(nodes)],
        batch_size=2000,
    )
    gpus(len(node_rows))
    stamp()
    in_sync(QUIET_AT)


def gpus(nodes: int):
    """8 H100s per node, written by the database in one statement (800,000 model instances would take minutes)."""
    from django.db import connection
    from django.utils import timezone

    from fleet.choices import GpuHealth
    from fleet.models import Gpu

    q = connection.ops.quote_name
    empty = "'[]'::jsonb" if connection.vendor == "postgresql" else "'[]'"
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < 7) "
            f"INSERT INTO fleet_gpu (node_id, {q('index')}, uuid, product, memory_mib, pci_bus_id, pci_device_id, "
            "mig_capable, mig_enabled, health, ecc_dbe_total, ecc_sbe_total, processes, created_at, updated_at) "
            "SELECT n.id, g.i, 'GPU-' || n.id || '-' || g.i, %s, 81559, '', '', TRUE, FALSE, %s, 0, 0, "
            f"{empty}, %s, %s FROM fleet_node n CROSS JOIN g",
            ["NVIDIA-H100-80GB-HBM3", GpuHealth.UNKNOWN, timezone.now(), timezone.now()],
        )
    assert Gpu.objects.count() == 8 * nodes


def stamp():
    """Every node reported just now: fresh for the next STALE_AFTER_SECONDS (agents: 45 s), whenever the run is."""
    from django.utils import timezone

    from fleet.models import Node

    Node.objects.update(last_seen_at=timezone.now())


def in_sync(at):
    """Each node runs its desired config at `at`, as its agent would report once applied."""
    from collections import defaultdict

    from fleet.models import Node
    from scheduling.selectors import desired_vs_observed

    groups = defaultdict(list)
    for row in desired_vs_observed(Node.objects.all(), at=at):
        groups[(row.config.mig_config_name or "", row.config.device_plugin_key)].append(row.node.pk)
    for (mig, plugin), ids in groups.items():
        for i in range(0, len(ids), 5000):
            Node.objects.filter(pk__in=ids[i : i + 5000]).update(
                observed_mig_config=mig, observed_device_plugin_config=plugin, config_state="success"
            )


def settle(at):
    """A full pass at `at` answers the seed's marks and records where the loop stands (nothing drifted)."""
    from worker.models import NodeDrift, ReconcileMark, ReconcileState
    from worker.reconcile import reconcile

    stamp()  # seeding 100,000 nodes takes longer than an agent node stays fresh
    assert reconcile(at=at, full=True) == [], "the seeded fleet is not in sync"
    assert not NodeDrift.objects.exists() and not ReconcileMark.objects.exists()
    assert ReconcileState.objects.get().held == [], "nodes went stale before the full pass: it evaluated too few"


def incremental(since, at, expected: set[int], drifted: int):
    """One incremental evaluation at `at`, the last one having been at `since`; checks its scope and findings."""
    from worker.models import ReconcileState
    from worker.reconcile import evaluate, tick_scope

    ReconcileState.objects.filter(pk=1).update(evaluated_at=since)
    start = clock.perf_counter()
    scope = tick_scope(at=at, full=False)
    result = evaluate(scope, at=at)
    seconds = clock.perf_counter() - start
    assert not scope.held, f"{len(scope.held)} nodes out of the loop (stale): the run would evaluate too little"
    assert scope.node_ids == expected, f"evaluated {len(scope.node_ids)} nodes, expected {len(expected)}"
    assert result.evaluated == len(expected), f"compared {result.evaluated} nodes, expected {len(expected)}"
    assert len(result.rows) == drifted, f"found {len(result.rows)} drifted, expected {drifted}"
    return seconds


def full(at, limit: int, drifted: int):
    """The full pass's evaluation of the first `limit` nodes; checks it compared every one."""
    from fleet.models import Node
    from worker.selectors import drift, reconcilable_nodes

    last = Node.objects.order_by("pk").values_list("pk", flat=True)[limit - 1]
    result = drift(reconcilable_nodes(Node.objects.filter(pk__lte=last)), at=at)
    assert result.evaluated == limit, f"the full pass compared {result.evaluated} of {limit} nodes"
    assert len(result.rows) == drifted, f"found {len(result.rows)} drifted, expected {drifted}"


def floor_nodes(connection, zone: str | None):
    """The least an evaluation reads: the nodes' observed columns and their live GPUs' shapes (raw SQL, tuples); only
    the nodes of the pools scheduled in `zone` when given (those the switch flips, found by pool as the tick does)."""
    in_zone = "n.pool_id IN (SELECT pool_id FROM scheduling_schedule WHERE time_zone = %s)"
    args = [zone] if zone else []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.id, n.pool_id, n.observed_mig_config, n.observed_device_plugin_config, n.config_state, "
            f"n.agent_config_id FROM fleet_node n {'WHERE ' + in_zone if zone else ''}",
            args,
        )
        nodes = cursor.fetchall()
        cursor.execute(
            f"SELECT g.node_id, g.{connection.ops.quote_name('index')}, g.product FROM fleet_gpu g "
            f"JOIN fleet_node n ON n.id = g.node_id WHERE g.gone_at IS NULL {'AND ' + in_zone if zone else ''}",
            args,
        )
        return nodes, cursor.fetchall()


def floor_quiet(connection):
    """The least a tick with nothing to do reads: the marks and every enabled schedule's windows (raw SQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, node_id, pool_id, everything FROM worker_reconcilemark")
        cursor.fetchall()
        cursor.execute(
            "SELECT s.pool_id, s.time_zone, s.baseline_profile_id, w.weekdays, w.start, w.end, w.profile_id "
            "FROM scheduling_schedule s LEFT JOIN scheduling_schedulewindow w ON w.schedule_id = s.id "
            "WHERE s.enabled"
        )
        return cursor.fetchall()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pools", type=int, default=500)
    parser.add_argument("--flip", type=int, help="nodes a window's end switches (default: a tenth, at most 10,000)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--full-runs", type=int, help="timed full passes at each size (default: half of --runs)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1,000 nodes, 50 pools")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pools = 1000, 50
    flip = args.flip or min(10_000, args.nodes // 10)
    per_pool = args.nodes // args.pools
    assert args.nodes % args.pools == 0 and flip % per_pool == 0, "nodes must fill pools evenly, flip whole pools"
    with tempfile.TemporaryDirectory() as scratch:
        connection, old_name = setup_django(scratch, "b4")
        try:
            from django.db import reset_queries
            from django.test.utils import CaptureQueriesContext

            from fleet.models import Node

            started = clock.perf_counter()
            seed(args.nodes, args.pools, flip // per_pool)
            settle(QUIET_AT - timedelta(seconds=30))
            seeded = clock.perf_counter() - started
            tokyo = set(Node.objects.filter(pool__schedule__time_zone="Asia/Tokyo").values_list("pk", flat=True))
            assert len(tokyo) == flip

            def timed(fn, runs):
                """Median of `runs` calls of fn() -> seconds; the nodes are stamped fresh before each, untimed."""
                samples = []
                for _ in range(runs + 1):  # the first is the warm-up
                    stamp()
                    samples.append(fn())
                return sorted(samples[1:])[len(samples[1:]) // 2]

            print(
                f"B4 reconcile evaluation: {args.nodes} nodes in {args.pools} pools on {connection.vendor} "
                f"(seeded in {seeded:.1f} s), median of {args.runs} runs, each checked to evaluate exactly the nodes "
                "it should",
                flush=True,
            )
            quiet = timed(lambda: incremental(QUIET_AT - timedelta(seconds=30), QUIET_AT, set(), 0), args.runs)
            stamp()
            with CaptureQueriesContext(connection) as queries:
                incremental(QUIET_AT - timedelta(seconds=30), QUIET_AT, set(), 0)
            floor = median_seconds(lambda: floor_quiet(connection), args.runs, warmup=1)
            ok_quiet = quiet <= QUIET_SECONDS
            print(
                f"  nothing changed   {quiet * 1000:8.1f} ms  (0 nodes evaluated, {len(queries)} queries)   "
                f"floor {floor * 1000:.1f} ms = {quiet / floor:.2f} x   target ≤ {QUIET_SECONDS:.0f} s: "
                f"{verdict(ok_quiet)}",
                flush=True,
            )
            flipped = timed(lambda: incremental(FLIP_AT - timedelta(seconds=60), FLIP_AT, tokyo, flip), args.runs)
            stamp()
            reset_queries()
            with CaptureQueriesContext(connection) as queries:
                incremental(FLIP_AT - timedelta(seconds=60), FLIP_AT, tokyo, flip)
            floor = median_seconds(lambda: floor_nodes(connection, "Asia/Tokyo"), args.runs, warmup=1)
            ok_flip = flipped <= FLIP_SECONDS
            print(
                f"  switch of {flip:>6}  {flipped * 1000:8.1f} ms  ({flip} nodes evaluated and drifted, "
                f"{len(queries)} queries)   floor {floor * 1000:.1f} ms = {flipped / floor:.2f} x   "
                f"target ≤ {FLIP_SECONDS:.0f} s: {verdict(ok_flip)}",
                flush=True,
            )

            def timed_full(limit):
                def run():
                    stamp()
                    start = clock.perf_counter()
                    full(QUIET_AT, limit, 0)
                    return clock.perf_counter() - start

                return timed(run, args.full_runs or max(1, args.runs // 2))

            whole, half = timed_full(args.nodes), timed_full(args.nodes // 2)
            floor = median_seconds(lambda: floor_nodes(connection, None), max(1, args.runs // 2), warmup=1)
            full_target = FULL_SECONDS_PER_10K * args.nodes / 10_000
            print(
                f"  full pass         {whole * 1000:8.1f} ms  ({args.nodes} nodes, the safety net)   "
                f"floor {floor * 1000:.1f} ms = {whole / floor:.2f} x   (information: ≤ {full_target:.1f} s was "
                f"B4's target before the tick was incremental: {verdict(whole <= full_target)})"
            )
            print(
                f"  full pass at {args.nodes // 2}: {half * 1000:.1f} ms; growth ratio {whole / half:.2f} (linear ≈ 2)"
            )
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    if args.nodes < 100_000:
        print(f"  (the tick targets are for 100,000 nodes; this run has {args.nodes / 100_000:.0%} of them)")
    ok = ok_quiet and ok_flip
    print(f"  targets (nothing changed, switch): {verdict(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
