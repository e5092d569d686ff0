"""B8: one config plan of 500 pools, each with its own profile and schedule, applied in one request.

Run: .venv/bin/python -m bench.b8_config_apply [--pools 500 --nodes-per-pool 2] [--quick]
Prints the dry-run plan and the apply (`POST /api/v1/config/apply/` as an admin with a token: schema check, diff,
every object through its service, the impact per pool, one audit event), the floor (the same rows written with
bulk_create in one transaction) and the ratio. Target: the apply within 10 s.
"""

import argparse
import sys
import tempfile
import time

from bench.common import setup_django, verdict

MAX_SECONDS = 10.0
H100 = "NVIDIA-H100-80GB-HBM3"


def seed(pools: int, nodes_per_pool: int):
    """A cluster whose nodes carry the labels the pools' selectors will pick, each with 8 whole H100s."""
    from fleet.models import Cluster, Gpu, Node

    cluster = Cluster.objects.create(name="bench", driver="agent")
    nodes = Node.objects.bulk_create(
        [
            Node(cluster=cluster, name=f"n{p:03d}-{i}", labels={"tessera.io/pool": f"p{p:03d}"}, ready=True,
                 allocatable={"nvidia.com/gpu": 8}, observed_mode="passthrough")
            for p in range(pools)
            for i in range(nodes_per_pool)
        ],
        batch_size=2000,
    )  # fmt: skip
    Gpu.objects.bulk_create(
        [Gpu(node=n, index=g, uuid=f"GPU-{n.pk}-{g}", product=H100, mig_capable=True) for n in nodes for g in range(8)],
        batch_size=5000,
    )


def documents(pools: int) -> list[dict]:
    docs = [{"kind": "QoSPolicy", "name": "serving", "required_qos": "guaranteed"}]
    for p in range(pools):
        name = f"p{p:03d}"
        docs.append({"kind": "Profile", "name": f"mig-{name}", "mode": "mig", "target_products": [H100],
                     "mig_layouts": {"all": {"1g.10gb": 1 + p % 7}}})  # fmt: skip
        docs.append({"kind": "Pool", "cluster": "bench", "name": name, "node_selector": f"tessera.io/pool={name}",
                     "profile": "whole", "qos_policy": "serving"})  # fmt: skip
        docs.append({"kind": "Schedule", "cluster": "bench", "pool": name, "name": f"{name}-by-day",
                     "time_zone": "Europe/Berlin", "exceptions": [{"date": "2026-12-25"}],
                     "windows": [{"name": "day", "weekdays": [0, 1, 2, 3, 4], "start": "08:00", "end": "20:00",
                                  "profile": f"mig-{name}"}]})  # fmt: skip
    docs.append({"kind": "Profile", "name": "whole", "mode": "passthrough", "target_products": [H100]})
    return docs


def floor(pools: int) -> float:
    """The same objects written with bulk_create in one transaction (rolled back): no checks, no audit, no plan."""
    from datetime import date
    from datetime import time as clock

    from django.db import transaction

    from fleet.models import Cluster, NodePool
    from scheduling.models import Schedule, ScheduleException, ScheduleWindow
    from sharing.models import PoolSharing, QoSPolicy, SharingProfile

    start = time.perf_counter()
    with transaction.atomic():
        cluster = Cluster.objects.get(name="bench")
        policy = QoSPolicy.objects.create(name="serving", required_qos="guaranteed")
        whole = SharingProfile.objects.create(name="whole", mode="passthrough", target_products=[H100])
        profiles = SharingProfile.objects.bulk_create(
            SharingProfile(name=f"mig-p{p:03d}", mode="mig", target_products=[H100],
                           mig_layouts={"all": {"1g.10gb": 1 + p % 7}})
            for p in range(pools)
        )  # fmt: skip
        rows = NodePool.objects.bulk_create(
            NodePool(cluster=cluster, name=f"p{p:03d}", node_selector=f"tessera.io/pool=p{p:03d}") for p in range(pools)
        )
        PoolSharing.objects.bulk_create(PoolSharing(pool=p, profile=whole, qos_policy=policy) for p in rows)
        schedules = Schedule.objects.bulk_create(
            Schedule(pool=p, name=f"{p.name}-by-day", time_zone="Europe/Berlin") for p in rows
        )
        ScheduleWindow.objects.bulk_create(
            ScheduleWindow(schedule=s, name="day", weekdays=[0, 1, 2, 3, 4], start=clock(8), end=clock(20), profile=pr)
            for s, pr in zip(schedules, profiles, strict=True)
        )
        ScheduleException.objects.bulk_create(ScheduleException(schedule=s, date=date(2026, 12, 25)) for s in schedules)
        elapsed = time.perf_counter() - start
        transaction.set_rollback(True)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pools", type=int, default=500)
    parser.add_argument("--nodes-per-pool", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke test: 50 pools")
    args = parser.parse_args()
    pools = 50 if args.quick else args.pools
    with tempfile.TemporaryDirectory() as scratch:
        connection, old_name = setup_django(scratch, "b8")
        try:
            from django.test import Client

            from config.celery import app

            # What the services enqueue (the reconcile loop's kick, selectors) goes to a queue nobody reads, as the
            # request leaves it to the workers in production.
            app.conf.task_always_eager, app.conf.broker_url = False, "memory://"

            from core.models import AuditEvent
            from core.services import api_token_rotate
            from sharing.models import SharingProfile
            from tests.factories import UserFactory

            seed(pools, args.nodes_per_pool)
            _, token = api_token_rotate(user=UserFactory(username="bench-admin", role="admin"))
            api = Client(HTTP_AUTHORIZATION=f"Token {token}")
            docs = documents(pools)
            floor_seconds = floor(pools)

            def post(path: str, body: dict):
                queries = []

                def count(execute, sql, params, many, context):
                    queries.append(1)
                    return execute(sql, params, many, context)

                start = time.perf_counter()
                with connection.execute_wrapper(count):
                    response = api.post(path, body, content_type="application/json")
                assert response.status_code == 200, response.content[:2000]
                return response.json(), time.perf_counter() - start, len(queries)

            plan, plan_seconds, plan_queries = post("/api/v1/config/plan/", {"documents": docs})
            assert len(plan["changes"]) == len(docs) and len(plan["impact"]) == pools, "the plan is not the whole"
            result, seconds, queries = post(
                "/api/v1/config/apply/", {"documents": docs, "versions": plan["versions"], "message": "bench"}
            )
            assert result["applied"] and SharingProfile.objects.count() == pools + 1
            assert AuditEvent.objects.filter(action="config.apply").count() == 1
            again, again_seconds, _ = post("/api/v1/config/plan/", {"documents": docs})
            assert again["changes"] == [], "applying the plan left differences"
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    ok = seconds <= MAX_SECONDS
    print(f"B8 config apply: {len(docs)} documents ({pools} pools with a profile and a schedule each, "
          f"{pools * args.nodes_per_pool} nodes)")  # fmt: skip
    print(f"  plan (dry run):      {plan_seconds:7.2f} s, {plan_queries} queries")
    print(f"  apply:               {seconds:7.2f} s, {queries} queries")
    print(f"  plan once applied:   {again_seconds:7.2f} s (no change)")
    print(f"  floor (bulk_create): {floor_seconds:7.2f} s; apply / floor = {seconds / floor_seconds:.1f}×")
    print(f"  target: apply ≤ {MAX_SECONDS:.0f} s: {verdict(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
