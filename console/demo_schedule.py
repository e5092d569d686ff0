"""The demo schedule of `make run`: pool demo-day-night on the simulated cluster — a few idle nodes of one
MIG-capable product — whose day/night schedule switches every few minutes, so that a new user sees, within minutes,
the preview of the coming switch, the rollout node by node, MIG Manager's labels change, the pool's Kueue quota
follow (ClusterQueue `demo-day-night`, made in the simulator) and the pool page say what runs until when.

The pace is a demo's only, and it is plain schedule data: MIG windows of `PERIOD_MINUTES / 2` starting every
`PERIOD_MINUTES` on the wall clock, written for the coming `HORIZON` and extended by `make run` while it runs
(`demo_schedule_extend`, a chore of the supervisor). Nothing in Tessera's schedule engine knows about it; a real
schedule has a few windows of hours (08:00–20:00 Mon–Fri). `make run --no-demo-schedule` turns it off.
"""

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from kubernetes import client

from core.audit import Actor
from fleet import services as fleet_services
from fleet.models import Cluster, NodePool
from scheduling import services as scheduling_services
from scheduling import windows
from scheduling.kueue import kueue_binding_set
from scheduling.models import KueueBinding, Schedule
from sharing import services as sharing_services
from sharing.choices import BusyPolicy
from sharing.mig import PRODUCTS
from sharing.models import SharingProfile
from worker.choices import LIVE_ROLLOUT_STATUSES
from worker.drivers.kubernetes.api import api_client, list_all
from worker.drivers.kubernetes.labels import node_ready, pod_gpu_resources
from worker.models import Rollout

POOL = "demo-day-night"
PERIOD_MINUTES = 4  # MIG for the first half of each period, whole GPUs for the second; divides a day
HORIZON = timedelta(hours=1)  # windows written ahead: 15 at this pace, so the schedule's page stays readable
EXTEND_BELOW = timedelta(minutes=30)  # written again when less is left: an audited schedule update every 30 min
NODES = 3
SCHEDULE = f"demo day/night (demo pace: switches every {PERIOD_MINUTES // 2} min)"
DAY_PROFILE, NIGHT_PROFILE = "demo-mig-slices", "demo-whole-gpus"
ACTOR = Actor.system("make run (demo schedule)")
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
CLUSTER_QUEUE = POOL  # a ClusterQueue of the simulator whose GPU quota Tessera keeps in step with the pool
KUEUE_LEAD_MINUTES = 1  # quota of vanishing resources lowered a minute before each switch (the default is 15)
MIG_LABELS = "nvidia.com/mig.config,nvidia.com/mig.config.state"  # what MIG Manager reads and writes (contracts §1)
DESCRIPTION = (
    "Made by `make run` to show a day/night switch while you watch: its schedule turns over every "
    f"{PERIOD_MINUTES // 2} minutes, a pace for the demo only (a real schedule switches at, say, 08:00 and 20:00). "
    "`make run --no-demo-schedule` turns it off."
)


def pace_windows(now: datetime, zone: ZoneInfo, *, period: int = PERIOD_MINUTES, horizon: timedelta = HORIZON):
    """(weekday, start, end) of the day windows from the one in force (or next) at `now` to `now + horizon`: the
    first half of every `period` minutes of the local wall clock."""
    local = now.astimezone(zone).replace(tzinfo=None)
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    minute = (local.hour * 60 + local.minute) // period * period
    end = local + horizon
    found = []
    while (start := day + timedelta(minutes=minute)) < end:
        stop = start + timedelta(minutes=period // 2)
        found.append((start.weekday(), start.time(), stop.time()))
        minute += period
    return found


def demo_schedule_seed(cluster: Cluster, *, enabled: bool = True) -> str:
    """Make the demo pool, its two profiles and its schedule on the simulated cluster once, then keep its windows
    ahead; with `enabled` False the schedule, if any, is switched off (and on again by the next start without it).
    Its Kueue binding follows suit. A pool whose schedule someone deleted is left alone. Returns a line for the
    terminal."""
    schedule = Schedule.objects.filter(pool__cluster=cluster, pool__name=POOL).first()
    if schedule is not None and schedule.enabled != enabled:
        scheduling_services.schedule_update(actor=ACTOR, schedule=schedule, enabled=enabled)
        binding = KueueBinding.objects.filter(pool=schedule.pool, cluster_queues=[CLUSTER_QUEUE]).first()
        if binding is not None:  # the quota stops following too (what was written stays)
            kueue_binding_set(
                actor=ACTOR, pool=schedule.pool, cluster_queues=[CLUSTER_QUEUE], lead_minutes=binding.lead_minutes,
                enabled=enabled,
            )  # fmt: skip
    if not enabled:
        return "Demo schedule: off (--no-demo-schedule)"
    if schedule is None:
        if NodePool.objects.filter(cluster=cluster, name=POOL).exists():
            return f"Demo schedule: none (pool {POOL} has no schedule any more; delete the pool to have it made again)"
        product, nodes = _idle_mig_nodes(cluster)
        if not nodes:
            return "Demo schedule: none (no idle MIG-capable node in the simulated fleet)"
        _create(cluster, product, nodes)
    demo_schedule_extend(cluster.pk)
    return (
        f"Demo schedule: pool {POOL} switches between {DAY_PROFILE} and {NIGHT_PROFILE} every "
        f"{PERIOD_MINUTES // 2} min (a demo-only pace; --no-demo-schedule turns it off)"
    )


@transaction.atomic
def _create(cluster: Cluster, product: str, nodes: list[str]) -> Schedule:
    pool = fleet_services.pool_create(
        actor=ACTOR,
        cluster=cluster,
        name=POOL,
        description=DESCRIPTION,
        node_selector=f"kubernetes.io/hostname in ({','.join(nodes)})",
    )
    day, night = _profiles(product)
    _cluster_queue(cluster)
    kueue_binding_set(actor=ACTOR, pool=pool, cluster_queues=[CLUSTER_QUEUE], lead_minutes=KUEUE_LEAD_MINUTES)
    return scheduling_services.schedule_create(
        actor=ACTOR,
        pool=pool,
        name=SCHEDULE,
        time_zone=settings.TIME_ZONE,
        baseline_profile=night,
        busy_policy=BusyPolicy.WAIT,
        wait_minutes=PERIOD_MINUTES // 2,
        windows=_rows(day, ZoneInfo(settings.TIME_ZONE), timezone.now()),
    )


@transaction.atomic
def demo_schedule_extend(cluster_id: int, *, now: datetime | None = None) -> bool:
    """Write the windows of the coming HORIZON again when less than EXTEND_BELOW is left (True when it did). The
    window in force stays, so the pool sees no change of value."""
    now = now or timezone.now()
    schedule = (
        Schedule.objects.select_for_update()
        .filter(pool__cluster_id=cluster_id, pool__name=POOL, name=SCHEDULE, enabled=True)
        .first()
    )
    if schedule is None:
        return False
    ahead = windows.transitions(schedule.to_calendar(), now, now + HORIZON)
    if ahead and ahead[-1].at - now >= EXTEND_BELOW:
        return False
    day = SharingProfile.objects.get(name=DAY_PROFILE)
    rows = _rows(day, ZoneInfo(schedule.time_zone), now)
    scheduling_services.schedule_update(actor=ACTOR, schedule=schedule, windows=rows)
    return True


def first_look(now: datetime | None = None) -> dict | None:
    """What the overview points a new user at while the demo schedule runs (None otherwise): its pool and next
    switch, the rollouts in progress, and the kubectl line that shows MIG Manager's labels on the pool's nodes."""
    schedule = (
        Schedule.objects.filter(pool__name=POOL, name=SCHEDULE, enabled=True)
        .select_related("pool__cluster")
        .prefetch_related("windows", "exceptions")
        .first()
    )
    if schedule is None:
        return None
    coming = windows.next_transition(schedule.to_calendar(), now or timezone.now())
    to_profile = coming and SharingProfile.objects.filter(pk=coming.to_value[0]).first()
    pool = schedule.pool
    return {
        "pool": pool,
        "pace_minutes": PERIOD_MINUTES // 2,
        "next_at": coming.at if coming else None,
        "next_profile": to_profile,
        "rollouts": list(Rollout.objects.filter(status__in=LIVE_ROLLOUT_STATUSES).order_by("-pk")[:3]),
        "kubectl": f"kubectl --kubeconfig {pool.cluster.kubeconfig_path} get nodes -l '{pool.node_selector}' "
        f"-L {MIG_LABELS} -w",
    }


def _rows(day_profile: SharingProfile, zone: ZoneInfo, now: datetime) -> list[dict]:
    return [
        {"name": "day", "weekdays": [weekday], "start": start, "end": end, "profile": day_profile, "qos_policy": None}
        for weekday, start, end in pace_windows(now, zone)
    ]


def _cluster_queue(cluster: Cluster) -> None:
    """ClusterQueue `demo-day-night` in the simulated cluster (Kueue's v1beta1 kind), unless it exists: Tessera
    writes its GPU quota, never creates it (docs/kueue.md)."""
    custom = client.CustomObjectsApi(api_client(cluster))
    try:
        custom.get_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", CLUSTER_QUEUE)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {"namespaceSelector": {}},
        }
        custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", body)


def _profiles(product: str) -> tuple[SharingProfile, SharingProfile]:
    """MIG by day (the product's smallest slice, as many as fit), whole GPUs by night; made once, kept after."""
    smallest = max((p for p in PRODUCTS[product].profiles if not p.attribute), key=lambda p: p.max_count)
    wanted = {
        DAY_PROFILE: {"mode": "mig", "mig_layouts": {"all": {smallest.name: smallest.max_count}}},
        NIGHT_PROFILE: {"mode": "passthrough"},
    }
    made = []
    for name, values in wanted.items():
        profile = SharingProfile.objects.filter(name=name).first()
        if profile is None:
            profile = sharing_services.profile_create(
                actor=ACTOR,
                name=name,
                description=f"Part of `make run`'s demo schedule (pool {POOL}).",
                target_products=[product],
                **values,
            )
        made.append(profile)
    return made[0], made[1]


def _idle_mig_nodes(cluster: Cluster) -> tuple[str, list[str]]:
    """The GPU product with the most Ready, schedulable, MIG-capable nodes no pod holds a GPU of, and up to NODES of
    those nodes, read from the cluster itself (Tessera's view of it may not have arrived yet)."""
    core = client.CoreV1Api(api_client(cluster))
    nodes, _ = list_all(core.list_node)
    pods, _ = list_all(core.list_pod_for_all_namespaces)
    busy = {(p.get("spec") or {}).get("nodeName") for p in pods if pod_gpu_resources(p)}
    by_product: dict[str, list[str]] = {}
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        product = labels.get("nvidia.com/gpu.product", "")
        if (
            labels.get("nvidia.com/mig.capable") == "true"
            and product in PRODUCTS
            and node_ready(node)
            and not (node.get("spec") or {}).get("unschedulable")
            and node["metadata"]["name"] not in busy
        ):
            by_product.setdefault(product, []).append(node["metadata"]["name"])
    if not by_product:
        return "", []
    product = max(sorted(by_product), key=lambda p: len(by_product[p]))
    return product, sorted(by_product[product])[:NODES]
