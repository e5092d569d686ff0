"""End to end (issue 20 point 1): a day (MIG) / night (whole GPU) schedule on a pool of the simulator, with Kueue's
ClusterQueue in place. Ahead of the switch the whole-GPU quota is lowered to what is in use and a new whole-GPU
Workload is not admitted; after the switch, once the nodes report MIG devices, the MIG quota is raised and a MIG
Workload is admitted. A quota changed behind Tessera's back is reported as drift and left alone until taken over.

The real Kubernetes driver and the engine run in-process against the simulator (as test_rollout_faults.py); the
schedule is evaluated at instants passed explicitly, so no clock is travelled.
"""

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from core.audit import Actor
from core.models import AuditEvent
from fleet.models import Node, NodePool
from scheduling import services as scheduling_services
from scheduling.kueue import kueue_binding_set, transition_quota
from scheduling.models import KueueBinding
from scheduling.quota import QuotaChange
from scheduling.selectors import schedule_transitions
from sharing import services as sharing_services
from tests.integration.test_rollout_faults import drive
from worker import reconcile
from worker.drivers import driver_for
from worker.inventory.cluster import sync_cluster_full
from worker.kueue import kueue_sync, kueue_take_over
from worker.models import Rollout

pytestmark = [pytest.mark.services, pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored")]
H100 = "NVIDIA-H100-80GB-HBM3"
POOL_NODES = ("gpu-node-0002", "gpu-node-0005")  # two H100 nodes of 8 GPUs
GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
FLAVOR = "tessera-h100-nvidia-h100-80gb-hbm3"
BERLIN = ZoneInfo("Europe/Berlin")
NIGHT = datetime(2026, 3, 4, 6, 0, tzinfo=BERLIN)  # a Wednesday; the day window starts at 08:00
SWITCH = datetime(2026, 3, 4, 8, 0, tzinfo=BERLIN)


def _kueue_object(kind: str, name: str, spec: dict, namespace: str | None = None) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": meta, "spec": spec}


def _submit(custom, name: str, resource: str, count: int) -> None:
    container = {"name": "main", "image": "busybox", "resources": {"limits": {resource: "1"}}}
    podset = {"name": "main", "count": count, "template": {"spec": {"containers": [container]}}}
    body = _kueue_object("Workload", name, {"queueName": "team", "podSets": [podset]}, "default")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "workloads", body)


def _workload(custom, name: str) -> dict:
    return custom.get_namespaced_custom_object(GROUP, VERSION, "default", "workloads", name)


def _admitted(custom, name: str) -> bool:
    conditions = _workload(custom, name).get("status", {}).get("conditions", [])
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)


def _quota(custom) -> dict[str, str]:
    cq = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "gpu")
    (group,) = cq["spec"]["resourceGroups"]
    (flavor,) = [f for f in group["flavors"] if f["name"] == FLAVOR]
    return {r["name"]: r["nominalQuota"] for r in flavor["resources"]}


def _roll_out(at, sim, cluster) -> None:
    (rollout_id,) = reconcile.reconcile(at=at)
    Rollout.objects.filter(pk=rollout_id).update(canary_count=0, batch_size=10)
    assert drive(Rollout.objects.get(pk=rollout_id), sim).status == "succeeded"
    sync_cluster_full(cluster)  # what the watcher records: the nodes' new allocatable


@pytest.mark.django_db
def test_quota_follows_a_day_night_schedule_across_the_switch(sim, custom, sim_cluster):
    cluster = sim_cluster
    driver_for(cluster).adopt_operator_configs()
    sync_cluster_full(cluster)
    pool = NodePool.objects.create(cluster=cluster, name="h100")
    Node.objects.filter(name__in=POOL_NODES).update(pool=pool)
    actor = Actor.system("test-admin")
    day = sharing_services.profile_create(
        actor=actor, name="day-mig", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    night = sharing_services.profile_create(actor=actor, name="night-whole", mode="passthrough", target_products=[H100])
    schedule = scheduling_services.schedule_create_day_night(
        actor=actor, pool=pool, time_zone="Europe/Berlin", day_profile=day, night_profile=night
    )
    custom.create_cluster_custom_object(
        GROUP, VERSION, "clusterqueues", _kueue_object("ClusterQueue", "gpu", {"namespaceSelector": {}})
    )
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        "default",
        "localqueues",
        _kueue_object("LocalQueue", "team", {"clusterQueue": "gpu"}, "default"),
    )
    binding = kueue_binding_set(actor=actor, pool=pool, cluster_queues=["gpu"], lead_minutes=30)

    # Night: whole GPUs. Tessera creates the flavor and gives it the 16 GPUs the nodes report.
    _roll_out(NIGHT, sim, cluster)
    assert kueue_sync(pool.pk, at=NIGHT) == {"gpu": "written"}
    flavor = custom.get_cluster_custom_object(GROUP, VERSION, "resourceflavors", FLAVOR)
    assert flavor["spec"]["nodeLabels"] == {"nvidia.com/gpu.product": H100}
    assert _quota(custom) == {GPU: "16", MIG: "0"}
    _submit(custom, "training", GPU, 3)
    assert sim.settle() and _admitted(custom, "training")
    assert kueue_sync(pool.pk, at=NIGHT) == {"gpu": "in step"}

    # The week's view of the switch: 16 GPUs become 112 MIG slices.
    (switch,) = [t for t in schedule_transitions(schedule, NIGHT, NIGHT + timedelta(hours=3))]
    assert transition_quota(pool, switch) == [
        QuotaChange(FLAVOR, GPU, 16, 0),
        QuotaChange(FLAVOR, MIG, 0, 112),
    ]

    # 15 minutes before the switch (lead 30): the whole-GPU quota is lowered to the 3 in use; a new job waits.
    before = SWITCH - timedelta(minutes=15)
    assert kueue_sync(pool.pk, at=before) == {"gpu": "written"}
    assert _quota(custom) == {GPU: "3", MIG: "0"}
    _submit(custom, "late-whole-gpu", GPU, 1)
    assert sim.settle()
    assert not _admitted(custom, "late-whole-gpu")
    reserved = _workload(custom, "late-whole-gpu")["status"]["conditions"][0]
    assert (
        reserved["status"] == "False"
        and f"insufficient unused quota for {GPU} in flavor {FLAVOR}" in reserved["message"]
    )
    lowered = AuditEvent.objects.filter(action="kueue.quota", actor_label="kueue").order_by("pk").last()
    assert (lowered.before, lowered.after) == ({f"{FLAVOR}/{GPU}": 16}, {f"{FLAVOR}/{GPU}": 3})

    # Just after the switch, before the nodes change: nothing is given (no MIG slice reported yet, GPUs going).
    after = SWITCH + timedelta(minutes=1)
    assert kueue_sync(pool.pk, at=after) == {"gpu": "written"}
    assert _quota(custom) == {GPU: "0", MIG: "0"}
    _submit(custom, "inference", MIG, 4)
    assert sim.settle() and not _admitted(custom, "inference")

    # The day layout rolls out; once the nodes report their slices the MIG quota is raised and the job admitted.
    custom.replace_namespaced_custom_object_status(  # the training job ends, as its pods would at the drain
        GROUP, VERSION, "default", "workloads", "training", _finished(_workload(custom, "training"))
    )
    _roll_out(after, sim, cluster)
    assert kueue_sync(pool.pk, at=after + timedelta(minutes=1)) == {"gpu": "written"}
    assert _quota(custom) == {GPU: "0", MIG: "112"}
    assert sim.settle() and _admitted(custom, "inference")
    assert _workload(custom, "inference")["status"]["admission"]["podSetAssignments"][0]["flavors"] == {MIG: FLAVOR}
    assert not _admitted(custom, "late-whole-gpu")  # never admitted onto a vanishing slice

    # Someone edits the quota: reported as drift, not overwritten, until an admin takes the queue over.
    cq = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "gpu")
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] = "50"
    custom.replace_cluster_custom_object(GROUP, VERSION, "clusterqueues", "gpu", cq)
    assert kueue_sync(pool.pk, at=after + timedelta(minutes=2)) == {"gpu": "drift"}
    assert _quota(custom)[MIG] == "50"
    binding.refresh_from_db()
    assert binding.drift == {"gpu": [{"flavor": FLAVOR, "resource": MIG, "live": 50, "wrote": 112}]}
    (drifted,) = AuditEvent.objects.filter(action="kueue.drift")
    assert (
        drifted.message
        == f"ClusterQueue gpu left alone: Changed outside Tessera: {FLAVOR} {MIG}: 50 (Tessera wrote 112)"
    )
    kueue_take_over(actor=actor, binding=binding, cluster_queue="gpu")
    assert kueue_sync(pool.pk, at=after + timedelta(minutes=3)) == {"gpu": "written"}
    assert _quota(custom)[MIG] == "112"
    assert KueueBinding.objects.get(pk=binding.pk).drift == {}


def _finished(workload: dict) -> dict:
    workload["status"]["conditions"].append(
        {
            "type": "Finished",
            "status": "True",
            "reason": "Succeeded",
            "message": "",
            "lastTransitionTime": "2026-03-04T07:00:00Z",
        }
    )
    return workload
