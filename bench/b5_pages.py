"""B5: the console's pages on B1's 10,000-node / 80,000-GPU fleet, each beside a floor of the same numbers.

Run: .venv/bin/python -m bench.b5_pages [--nodes 10000 --gpus-per-node 8] [--runs 7] [--quick]
Targets: every page at most 300 ms (median), at most 3x its floor, and the same number of queries at a tenth of the
fleet as at the whole fleet.

Each page is requested through the Django test client, signed in as a viewer (a session, as a browser). Its floor is
a request through the same client, middleware, session and role check to a bare view of this module that reads the
page's numbers and rows with the least raw SQL that produces them (a query or two per panel) and renders every row
it read as an HTML table through the template engine, in the same base layout: what any page of this stack showing
those numbers costs. Both run interleaved; medians are compared.
"""

import argparse
import statistics
import sys
import tempfile
import time
from datetime import timedelta

from bench.b1_gpu_list import seed as seed_fleet
from bench.common import setup_django, verdict

MAX_MS = 300.0
MAX_RATIO = 3.0
PAGE_SIZE = 50  # the node, GPU and audit lists' page size
NODE_PAGE = 50  # the node list's page the issue measured beside the first
UPCOMING_HOURS = 48


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7, help="measured runs of each page after a warm-up")
    parser.add_argument("--quick", action="store_true", help="smoke test: 600 nodes, 3 runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.runs = 600, 3
    return args


# --- the fleet -----------------------------------------------------------------------------------------------------


def seed_objects():
    """What the object pages show, on top of B1's fleet: a profile assigned to a pool and pinned on nodes, a schedule
    on another pool, a running rollout of 200 nodes with its audit trail, and a QoS compliance report."""
    from django.utils import timezone

    from core.models import AuditEvent
    from fleet.models import Node, NodePool
    from scheduling.models import Schedule, ScheduleWindow
    from sharing.models import NodePin, PoolSharing, QoSComplianceReport, QoSPolicy, SharingProfile
    from worker.models import NodeChange, Rollout

    now = timezone.now()
    pools = list(NodePool.objects.order_by("name")[:2])
    profile = SharingProfile.objects.create(
        name="mig-7", mode="mig", mig_layouts={"all": {"1g.10gb": 7}}, target_products=["NVIDIA-H100-80GB-HBM3"]
    )
    policy = QoSPolicy.objects.create(name="guaranteed")
    PoolSharing.objects.create(pool=pools[0], profile=profile, qos_policy=policy)
    QoSComplianceReport.objects.create(pool=pools[0], policy=policy, checked_at=now, pods_checked=100)
    nodes = list(Node.objects.filter(pool=pools[0]).order_by("name")[:200])
    NodePin.objects.bulk_create([NodePin(node=node, profile=profile, reason="bench") for node in nodes[100:110]])
    # A baseline profile too, so that whatever the time of day the next change has a profile whose impact on the
    # pool's nodes the schedule page previews.
    night = SharingProfile.objects.create(name="time-4", mode="time_slicing", replicas=4)
    schedule = Schedule.objects.create(pool=pools[1], name="office", time_zone="Europe/Berlin", baseline_profile=night)
    ScheduleWindow.objects.create(
        schedule=schedule, name="day", weekdays=[0, 1, 2, 3, 4, 5, 6], start="08:00", end="20:00", profile=profile
    )
    rollout = Rollout.objects.create(
        title="bench", trigger="user", actor_label="bench", pool=pools[0], profile=profile, batch_size=20
    )
    statuses = ("succeeded", "verifying", "applying", "waiting_for_idle", "queued")
    changes = NodeChange.objects.bulk_create(
        [
            NodeChange(
                rollout=rollout,
                node=node,
                position=k,
                profile=profile,
                status=statuses[min(k // 40, 4)],
                deadline=now + timedelta(minutes=9),
            )
            for k, node in enumerate(nodes)
        ]
    )
    AuditEvent.objects.bulk_create(
        [
            AuditEvent(
                at=now,
                actor_kind="system",
                actor_label="rollout",
                action="nodechange.succeeded",
                object_type="nodechange",
                object_id=str(change.pk),
                object_repr=f"change {change.pk}",
                before={"status": "verifying"},
                after={"status": "succeeded"},
            )  # fmt: skip
            for change in changes[:40]
        ]
    )
    return {"profile": profile, "schedule": schedule, "rollout": rollout, "pool": pools[0], "node": nodes[0]}


def seed_audit(start: int, stop: int) -> None:
    """One audit event per node (a label edit), so the audit log is as long as the fleet is large."""
    from django.utils import timezone

    from core.models import AuditEvent
    from fleet.models import Node

    now = timezone.now()
    rows = Node.objects.order_by("pk").values_list("pk", "name")[start:stop]
    AuditEvent.objects.bulk_create(
        [
            AuditEvent(
                at=now - timedelta(seconds=stop - i),
                actor_kind="user",
                actor_label="ops",
                action="node.label",
                object_type="node",
                object_id=str(pk),
                object_repr=name,
                before={"labels": {"team": "a"}},
                after={"labels": {"team": "b"}},
            )  # fmt: skip
            for i, (pk, name) in enumerate(rows, start)
        ],
        batch_size=2000,
    )


# --- floors: the fewest raw queries that produce each page's numbers and rows ----------------------------------------


class Sql:
    """Raw queries against the models' tables, written once for SQLite and PostgreSQL."""

    def __init__(self, connection):
        from django.utils import timezone

        from fleet.querysets import agent_stale_cutoff, stale_cutoff
        from fleet.selectors import pending_deadline

        self.connection = connection
        now = timezone.now()
        self.cutoffs = {
            "stale": stale_cutoff(now),
            "agent_stale": agent_stale_cutoff(now),
            "stuck": pending_deadline(now),
        }

    def rows(self, sql: str, params=()) -> list[tuple]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    # Fragments shared by the floors: the stale rule (per cluster driver) and a page of nodes with their GPU summary.
    def stale_case(self):
        sql = (
            "CASE WHEN n.last_seen_at IS NULL OR (c.driver = 'agent' AND n.last_seen_at < %s) "
            "OR (c.driver <> 'agent' AND n.last_seen_at < %s) THEN 1 ELSE 0 END"
        )
        return sql, [self.cutoffs["agent_stale"], self.cutoffs["stale"]]

    def node_totals(self, where: str = "", params=()) -> list[tuple]:
        """Node counts by what needs attention, agent nodes and clusters in one query; the nodes with an unhealthy
        GPU in a second, read from the few unhealthy GPUs (an EXISTS per node in the first costs more)."""
        stale, stale_params = self.stale_case()
        totals = self.rows(
            f"""
            SELECT COUNT(*), SUM(CASE WHEN n.config_state = 'failed' THEN 1 ELSE 0 END),
                   SUM(CASE WHEN n.config_state IN ('pending', 'applying', 'rebooting') THEN 1 ELSE 0 END),
                   SUM(CASE WHEN n.config_state IN ('pending', 'applying', 'rebooting')
                            AND n.config_state_since < %s THEN 1 ELSE 0 END),
                   SUM({stale}), SUM(CASE WHEN n.ready = %s THEN 1 ELSE 0 END),
                   SUM(CASE WHEN c.driver = 'agent' THEN 1 ELSE 0 END),
                   SUM(CASE WHEN c.driver = 'agent' AND {stale} = 1 THEN 1 ELSE 0 END),
                   (SELECT COUNT(*) FROM fleet_cluster)
            FROM fleet_node n JOIN fleet_cluster c ON c.id = n.cluster_id
            WHERE n.gone_at IS NULL {where}
            """,
            [self.cutoffs["stuck"], *stale_params, False, *stale_params, *params],
        )
        unhealthy = self.rows(
            f"""
            SELECT COUNT(DISTINCT g.node_id) FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id
            WHERE g.gone_at IS NULL AND g.health IN ('degraded', 'unhealthy') AND n.gone_at IS NULL {where}
            """,
            params,
        )
        return totals + unhealthy

    def gpu_groups(self, where: str = "", params=()) -> list[tuple]:
        """Live GPUs grouped by product, cluster and sharing mode with their sums: every GPU total and chart folds
        out of these rows in Python."""
        return self.rows(
            f"""
            SELECT g.product, c.id, c.name, n.observed_mode, COUNT(*),
                   SUM(CASE WHEN g.mig_enabled THEN 1 ELSE 0 END), SUM(CASE WHEN g.mig_capable THEN 1 ELSE 0 END),
                   SUM(CASE WHEN g.health IN ('degraded', 'unhealthy') THEN 1 ELSE 0 END),
                   SUM(g.utilization_pct), COUNT(g.utilization_pct), MAX(g.metrics_at)
            FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id JOIN fleet_cluster c ON c.id = n.cluster_id
            WHERE g.gone_at IS NULL AND n.gone_at IS NULL {where}
            GROUP BY g.product, c.id, c.name, n.observed_mode
            """,
            params,
        )

    def node_page(self, offset: int) -> list[tuple]:
        """One page of the node table, in its order, with each node's GPU summary: one query."""
        return self.rows(
            f"""
            SELECT page.id, page.name, page.cluster_name, page.pool_name, page.ready, page.observed_mode,
                   page.config_state, page.last_seen_at, page.driver_version, COUNT(g.id),
                   SUM(CASE WHEN g.health NOT IN ('healthy', 'unknown') THEN 1 ELSE 0 END), AVG(g.utilization_pct),
                   MAX(g.product), MAX(g.metrics_at)
            FROM (SELECT n.id, n.name, c.name AS cluster_name, p.name AS pool_name, n.ready, n.observed_mode,
                         n.config_state, n.last_seen_at, n.driver_version
                  FROM fleet_node n JOIN fleet_cluster c ON c.id = n.cluster_id
                  LEFT JOIN fleet_nodepool p ON p.id = n.pool_id
                  WHERE n.gone_at IS NULL ORDER BY c.name, n.name, n.id LIMIT {PAGE_SIZE} OFFSET {offset}) page
            LEFT JOIN fleet_gpu g ON g.node_id = page.id AND g.gone_at IS NULL
            GROUP BY page.id, page.name, page.cluster_name, page.pool_name, page.ready, page.observed_mode,
                     page.config_state, page.last_seen_at, page.driver_version
            ORDER BY page.cluster_name, page.name, page.id
            """
        )

    def filter_choices(self) -> list[tuple]:
        """The filter controls' options: clusters and pools in one query, the GPU products in a second (inside a
        UNION, SQLite would not read them from the product index)."""
        return self.rows(
            """
            SELECT 'cluster', CAST(id AS TEXT), name FROM fleet_cluster
            UNION ALL SELECT 'pool', CAST(id AS TEXT), name FROM fleet_nodepool
            """
        ) + self.rows("SELECT DISTINCT product FROM fleet_gpu WHERE gone_at IS NULL ORDER BY product")

    # One function per page: its queries, rows returned as they come.
    def overview(self):
        return [
            self.node_totals(),
            self.gpu_groups(),
            self.rows("SELECT SUM(violation_count), COUNT(*) FROM sharing_qoscompliancereport"),
            self.rows(
                """SELECT s.id, s.name, s.time_zone, p.name, w.weekdays, w.start, w."end", sp.name,
                          (SELECT COUNT(*) FROM fleet_node n WHERE n.pool_id = s.pool_id AND n.gone_at IS NULL)
                   FROM scheduling_schedule s JOIN fleet_nodepool p ON p.id = s.pool_id
                   JOIN scheduling_schedulewindow w ON w.schedule_id = s.id
                   JOIN sharing_sharingprofile sp ON sp.id = w.profile_id WHERE s.enabled = %s""",
                [True],
            ),
            self.filter_choices(),
            self.node_page(0),
        ]

    def nodes(self, page: int = 1):
        count = self.rows("SELECT COUNT(*) FROM fleet_node WHERE gone_at IS NULL")
        page = min(page, max(1, -(-count[0][0] // PAGE_SIZE)))  # past the end, the list shows its last page
        return [count, self.filter_choices(), self.node_page((page - 1) * PAGE_SIZE)]

    def nodes_p50(self):
        return self.nodes(NODE_PAGE)

    def gpus(self):
        count = self.rows(
            "SELECT COUNT(*) FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id "
            "WHERE g.gone_at IS NULL AND n.gone_at IS NULL"
        )
        page = self.rows(
            f"""
            SELECT page.*, (SELECT COUNT(*) FROM fleet_migdevice m WHERE m.gpu_id = page.id)
            FROM (SELECT g.id, g."index", g.uuid, g.product, g.memory_mib, g.memory_used_mib, g.health,
                         g.mig_enabled, g.utilization_pct, g.temperature_c, g.power_w, g.metrics_at,
                         n.id AS node_id, n.name AS node_name, n.observed_mode, c.name AS cluster_name, p.name
                  FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id JOIN fleet_cluster c ON c.id = n.cluster_id
                  LEFT JOIN fleet_nodepool p ON p.id = n.pool_id
                  WHERE g.gone_at IS NULL AND n.gone_at IS NULL
                  ORDER BY c.name, n.name, g."index", g.id LIMIT {PAGE_SIZE}) page
            ORDER BY page.cluster_name, page.node_name, page."index", page.id
            """
        )
        return [count, self.filter_choices(), page]

    def clusters(self):
        return [
            self.rows(
                """
                SELECT c.id, c.name, c.driver, c.connection_state, c.last_contact_at,
                       (SELECT COUNT(*) FROM fleet_nodepool p WHERE p.cluster_id = c.id),
                       (SELECT COUNT(*) FROM fleet_node n WHERE n.cluster_id = c.id AND n.gone_at IS NULL),
                       (SELECT COUNT(*) FROM fleet_gpu g JOIN fleet_node n ON n.id = g.node_id
                         WHERE n.cluster_id = c.id AND n.gone_at IS NULL AND g.gone_at IS NULL)
                FROM fleet_cluster c ORDER BY c.name
                """
            )
        ]

    def node(self, pk: int):
        return [
            self.rows(
                """SELECT n.*, c.name, c.driver, p.name, pin.profile_id, sh.profile_id, sh.qos_policy_id
                   FROM fleet_node n JOIN fleet_cluster c ON c.id = n.cluster_id
                   LEFT JOIN fleet_nodepool p ON p.id = n.pool_id LEFT JOIN sharing_nodepin pin ON pin.node_id = n.id
                   LEFT JOIN sharing_poolsharing sh ON sh.pool_id = n.pool_id WHERE n.id = %s""",
                [pk],
            ),
            self.rows(
                """SELECT g.*, m.profile, m.start, m.size, m.uuid, m.memory_mib, m.in_use_by FROM fleet_gpu g
                   LEFT JOIN fleet_migdevice m ON m.gpu_id = g.id WHERE g.node_id = %s AND g.gone_at IS NULL
                   ORDER BY g."index", m.start""",
                [pk],
            ),
            self.rows(
                """SELECT ch.id, ch.status, ch.started_at, ch.finished_at, r.id, r.title FROM worker_nodechange ch
                   JOIN worker_rollout r ON r.id = ch.rollout_id WHERE ch.node_id = %s ORDER BY ch.id DESC LIMIT 20""",
                [pk],
            ),
        ]

    def pool(self, pk: int):
        pool = self.rows(
            """SELECT p.*, c.name, sp.name, q.name, r.checked_at, r.violation_count FROM fleet_nodepool p
               JOIN fleet_cluster c ON c.id = p.cluster_id LEFT JOIN sharing_poolsharing sh ON sh.pool_id = p.id
               LEFT JOIN sharing_sharingprofile sp ON sp.id = sh.profile_id
               LEFT JOIN sharing_qospolicy q ON q.id = sh.qos_policy_id
               LEFT JOIN sharing_qoscompliancereport r ON r.pool_id = p.id WHERE p.id = %s""",
            [pk],
        )
        return [pool, self.node_totals("AND n.pool_id = %s", [pk]), self.gpu_groups("AND n.pool_id = %s", [pk])]

    def profile(self, pk: int):
        return [
            self.rows(
                """SELECT sp.*, u.username, p.id, p.name, c.name, sh.updated_at FROM sharing_sharingprofile sp
                   LEFT JOIN auth_user u ON u.id = sp.created_by_id
                   LEFT JOIN sharing_poolsharing sh ON sh.profile_id = sp.id
                   LEFT JOIN fleet_nodepool p ON p.id = sh.pool_id LEFT JOIN fleet_cluster c ON c.id = p.cluster_id
                   WHERE sp.id = %s""",
                [pk],
            ),
            # The page's "On each cluster": every cluster whose ClusterPolicy was read, with its MIG strategy.
            self.rows(
                """SELECT id, name, mig_strategy, device_plugin_version FROM fleet_cluster
                   WHERE cluster_policy_read_at IS NOT NULL ORDER BY name"""
            ),
            self.rows(
                """SELECT n.id, n.name, pin.reason, pin.created_at, u.username FROM sharing_nodepin pin
                   JOIN fleet_node n ON n.id = pin.node_id LEFT JOIN auth_user u ON u.id = pin.pinned_by_id
                   WHERE pin.profile_id = %s ORDER BY n.name""",
                [pk],
            ),
            self.rows(
                """SELECT at, actor_label, action, before, after FROM core_auditevent
                   WHERE object_type = 'sharingprofile' AND object_id = %s ORDER BY at DESC, id DESC LIMIT 10""",
                [str(pk)],
            ),
        ]

    def schedule(self, pk: int):
        return [
            self.rows(
                """SELECT s.*, p.name, w.weekdays, w.start, w."end", sp.name FROM scheduling_schedule s
                   JOIN fleet_nodepool p ON p.id = s.pool_id JOIN scheduling_schedulewindow w ON w.schedule_id = s.id
                   JOIN sharing_sharingprofile sp ON sp.id = w.profile_id WHERE s.id = %s""",
                [pk],
            ),
            # What the next change's impact is computed from, counted (the page shows counts): the pool's nodes and
            # those no pin holds (they follow the schedule), their GPUs, MIG devices and pods.
            self.rows(
                """SELECT COUNT(DISTINCT n.id), COUNT(DISTINCT CASE WHEN pin.id IS NULL THEN n.id END),
                          COUNT(DISTINCT g.id), COUNT(m.id),
                          (SELECT COUNT(*) FROM fleet_pod pod JOIN fleet_node pn ON pn.id = pod.node_id
                           WHERE pn.pool_id = s.pool_id AND pn.gone_at IS NULL)
                   FROM scheduling_schedule s JOIN fleet_node n ON n.pool_id = s.pool_id
                   LEFT JOIN sharing_nodepin pin ON pin.node_id = n.id
                   LEFT JOIN fleet_gpu g ON g.node_id = n.id AND g.gone_at IS NULL
                   LEFT JOIN fleet_migdevice m ON m.gpu_id = g.id
                   WHERE s.id = %s AND n.gone_at IS NULL GROUP BY s.pool_id""",
                [pk],
            ),
        ]

    def rollout(self, pk: int):
        return [
            self.rows(
                """SELECT r.*, p.name, sp.name, ch.status, COUNT(*) FROM worker_rollout r
                   LEFT JOIN fleet_nodepool p ON p.id = r.pool_id
                   LEFT JOIN sharing_sharingprofile sp ON sp.id = r.profile_id
                   JOIN worker_nodechange ch ON ch.rollout_id = r.id WHERE r.id = %s
                   GROUP BY r.id, p.name, sp.name, ch.status""",
                [pk],
            ),
            self.rows(
                """SELECT ch.id, ch.position, ch.status, ch.attempts, ch.started_at, ch.error, n.id, n.name
                   FROM worker_nodechange ch JOIN fleet_node n ON n.id = ch.node_id
                   WHERE ch.rollout_id = %s ORDER BY ch.position""",
                [pk],
            ),
            self.rows(
                """SELECT at, actor_label, action, object_repr, message FROM core_auditevent
                   WHERE (object_type = 'rollout' AND object_id = %s) OR (object_type = 'nodechange' AND object_id IN
                          (SELECT CAST(id AS TEXT) FROM worker_nodechange WHERE rollout_id = %s))
                   ORDER BY at DESC, id DESC LIMIT 50""",
                [str(pk), pk],
            ),
        ]

    def audit(self):
        return [
            self.rows("SELECT COUNT(*) FROM core_auditevent"),
            self.rows(
                f"""SELECT id, at, actor_label, actor_kind, action, object_type, object_id, object_repr, before,
                           after, message FROM core_auditevent ORDER BY at DESC, id DESC LIMIT {PAGE_SIZE}"""
            ),
        ]


# --- the run -------------------------------------------------------------------------------------------------------


class FloorUrls:
    """A URLconf: the project's, plus the floor's view (an object, so nothing is imported before Django's set-up)."""

    def __init__(self, urlpatterns):
        self.urlpatterns = urlpatterns


def install_floor(floors: dict) -> None:
    from django.conf import settings
    from django.http import HttpResponse
    from django.template import engines
    from django.urls import clear_url_caches, path

    from config.urls import urlpatterns
    from core.roles import Role
    from core.views import role_required

    # Every row the floor read, as table rows in the base layout through the template engine: the least a page of
    # this stack pays to show them (a cell per value, escaped), whatever its markup.
    template = engines["django"].from_string(
        '{% extends "base.html" %}{% block content %}{% for rows in results %}<table>{% for row in rows %}<tr>'
        "{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>{% endfor %}</table>{% endfor %}{% endblock %}"
    )

    @role_required(Role.VIEWER)
    def floor_view(request, name):
        return HttpResponse(template.render({"results": floors[name]()}, request))

    settings.ROOT_URLCONF = FloorUrls([path("bench-floor/<str:name>/", floor_view), *urlpatterns])
    clear_url_caches()


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-b5-") as scratch_dir:
        connection, old_name = setup_django(scratch_dir, "b5")
        try:
            return run(args, connection)
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)


def timed_ms(fn) -> tuple[float, float]:
    """Wall and CPU milliseconds of `fn()`; the CPU time is this process's (with SQLite, the database's too), which
    other work on a busy box does not inflate as it does the wall time."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def query_counts(client, connection, pages) -> dict:
    from django.test.utils import CaptureQueriesContext

    counts = {}
    for name, url in pages.items():
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 200, f"{url}: {response.status_code} {response.content[:300]!r}"
        counts[name] = len(captured)
    return counts


def analyze(connection) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def run(args, connection):
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from fleet.models import Gpu, Node

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    small = max(args.nodes // 10, 21)
    started = time.perf_counter()
    seed_fleet(small, args.gpus_per_node)
    objects = seed_objects()
    seed_audit(0, small)
    analyze(connection)
    sql = Sql(connection)
    floors = {
        "overview": sql.overview,
        "nodes": sql.nodes,
        f"nodes p{NODE_PAGE}": sql.nodes_p50,
        "gpus": sql.gpus,
        "clusters": sql.clusters,
        "node": lambda: sql.node(objects["node"].pk),
        "pool": lambda: sql.pool(objects["pool"].pk),
        "profile": lambda: sql.profile(objects["profile"].pk),
        "schedule": lambda: sql.schedule(objects["schedule"].pk),
        "rollout": lambda: sql.rollout(objects["rollout"].pk),
        "audit": sql.audit,
    }
    pages = {
        "overview": "/",
        "nodes": "/nodes/",
        f"nodes p{NODE_PAGE}": f"/nodes/?page={NODE_PAGE}",
        "gpus": "/gpus/",
        "clusters": "/clusters/",
        "node": f"/nodes/{objects['node'].pk}/",
        "pool": f"/pools/{objects['pool'].pk}/",
        "profile": f"/profiles/{objects['profile'].pk}/",
        "schedule": f"/schedules/{objects['schedule'].pk}/",
        "rollout": f"/rollouts/{objects['rollout'].pk}/",
        "audit": "/audit/",
    }
    install_floor(floors)
    user = get_user_model().objects.create(username="bench")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    small_counts = query_counts(client, connection, pages)

    seed_fleet(args.nodes, args.gpus_per_node, start=small)
    seed_audit(small, args.nodes)
    analyze(connection)
    seeded = time.perf_counter() - started
    counts = query_counts(client, connection, pages)
    floor_counts = {}
    for name in pages:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/bench-floor/{name}/").status_code == 200
        floor_counts[name] = len(captured)

    print(
        f"B5 console pages: {Node.objects.count()} nodes, {Gpu.objects.count()} GPUs on {connection.vendor} "
        f"(seeded in {seeded:.1f} s), median of {args.runs} runs, signed in as a viewer, Django test client"
    )
    heading = ("page", "ms", "floor ms", "ratio", "queries", "at 1/10", "floor q", "cpu ms", "floor cpu")
    print("  {:<12} {:>8} {:>9} {:>6} {:>8} {:>8} {:>8} {:>8} {:>9}  verdict".format(*heading))
    failed = []
    for name, url in pages.items():
        page_times, floor_times = [], []
        client.get(url), client.get(f"/bench-floor/{name}/")  # warm-up
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            page_times.append(timed_ms(lambda: client.get(url)))  # noqa: B023 - called at once
            floor_times.append(timed_ms(lambda: client.get(f"/bench-floor/{name}/")))  # noqa: B023
        (page_ms, page_cpu), (floor_ms, floor_cpu) = medians(page_times), medians(floor_times)
        ratio = page_ms / floor_ms
        ok = page_ms <= MAX_MS and ratio <= MAX_RATIO and counts[name] <= small_counts[name]
        if not ok:
            failed.append(name)
        print(
            f"  {name:<12} {page_ms:8.1f} {floor_ms:9.1f} {ratio:6.2f} {counts[name]:8d} {small_counts[name]:8d} "
            f"{floor_counts[name]:8d} {page_cpu:8.1f} {floor_cpu:9.1f}  {verdict(ok)}"
        )
    print(
        f"targets: <= {MAX_MS:g} ms, <= {MAX_RATIO:g}x the floor, queries no more than at 1/10 of the fleet   "
        f"{verdict(not failed)}{'  (' + ', '.join(failed) + ')' if failed else ''}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
