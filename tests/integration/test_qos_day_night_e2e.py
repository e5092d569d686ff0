"""End to end (issue 8): a day/night schedule switches both the sharing profile and the QoS policy of a pool, the
settings land through a real agent with an audit trail, and the compliance report names the offending pods.

A real Tessera server (gunicorn, eager tasks) and the real agent process (`python -m agent --simulate`, 2 idle H100s)
run the agent pool. Schedules are evaluated on the test's side only, at instants passed explicitly
(`reconcile(at=…)`): the server and the agent never look at the time of day, so no clock is travelled.

Compliance takes the Kubernetes path, the only one by which Tessera observes pods: the emulated Kubernetes API
server of `simulator` (in process, real HTTPS) runs a second cluster whose pool requires Guaranteed pods; its
workload places a BestEffort and a Guaranteed pod, `worker.inventory.pods.sync_pods` reads them with the official
client and the beat's compliance task checks them. The simulated API serves pods read-only, so the two pods are
placed in its store as its scheduler would, not created through the client.
"""

import signal
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from core.audit import Actor
from core.models import AuditEvent
from fleet import agent_credentials
from fleet.models import Gpu, MigDevice, Node
from scheduling import selectors as scheduling_selectors
from scheduling import services as scheduling_services
from sharing import services as sharing_services
from sharing.models import QoSComplianceReport
from simulator import Simulator
from simulator.resources import PODS
from simulator.workload import pod_object
from tests.factories import ClusterFactory, NodePoolFactory, UserFactory
from tests.processes import finish, simulated_agent, wait_until, web_server
from worker import reconcile
from worker.choices import ChangeStatus
from worker.inventory.cluster import sync_cluster_full
from worker.inventory.pods import sync_pods
from worker.models import NodeChange, Rollout
from worker.tasks import qos_compliance_refresh

pytestmark = [
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored"),
]
H100 = "NVIDIA-H100-80GB-HBM3"
SEED = 11
HOSTNAME = f"sim-node-{SEED}"  # the simulated host's name for this seed
BERLIN = ZoneInfo("Europe/Berlin")
NOON = datetime(2026, 3, 4, 12, 0, tzinfo=BERLIN)  # a Wednesday, inside the day window
# The simulated H100 runs graphics clocks of 210-1980 MHz (agent/simnvml/devices.py CLOCKS_MHZ["hopper"]).
TRAINING_CLOCKS = (1410, 1980)


def _succeeded(rollout_id: int, what: str) -> NodeChange:
    return wait_until(
        lambda: NodeChange.objects.filter(rollout_id=rollout_id, status=ChangeStatus.SUCCEEDED).first(),
        timeout=30,
        message=what,
    )


def _gpu_pod(name: str, node: str, cpu_memory: dict | None = None) -> dict:
    """A workload pod holding one GPU, as the simulated cluster places it: with CPU and memory limits (requests
    default to them: Guaranteed), else the GPU alone (BestEffort)."""
    container = {"name": "main", "image": "nvcr.io/nvidia/tritonserver:25.01-py3"}
    container["resources"] = {"limits": {**(cpu_memory or {}), "nvidia.com/gpu": "1"}}
    return pod_object(name=name, namespace="inference", node=node, containers=[container], labels={"app": name})


def test_day_night_schedule_switches_profile_and_qos_through_the_agent(tmp_path, settings):
    rollout_defaults = {**settings.TESSERA["ROLLOUT_DEFAULTS"], "verify_timeout_seconds": 30}
    settings.TESSERA = {**settings.TESSERA, "ROLLOUT_DEFAULTS": rollout_defaults}
    actor = Actor.for_user(UserFactory(username="admin", role="admin"))
    inference = sharing_services.qos_policy_create(
        actor=actor, name="inference", required_qos="guaranteed", transparent_hugepages="madvise"
    )
    training = sharing_services.qos_policy_create(
        actor=actor,
        name="training",
        required_qos="guaranteed",
        transparent_hugepages="always",
        gpu_clock_min_mhz=TRAINING_CLOCKS[0],
        gpu_clock_max_mhz=TRAINING_CLOCKS[1],
    )
    day = sharing_services.profile_create(
        actor=actor, name="day-mig-3g", mode="mig", target_products=[H100], mig_layouts={"all": {"3g.40gb": 2}}
    )
    night = sharing_services.profile_create(
        actor=actor, name="night-whole-gpu", mode="passthrough", target_products=[H100]
    )

    # Set up while the agent's node is in no pool: the reconcile that schedule_create and pool_set_qos_policy trigger
    # runs at the real time of day, and must not roll anything out to it.
    cluster = ClusterFactory(name="lab", driver="agent", kubeconfig_path="")
    _, join_token = agent_credentials.agent_join_token_create(actor=actor, cluster=cluster, name="lab")
    pool = NodePoolFactory(cluster=cluster, name="lab-h100")
    schedule = scheduling_services.schedule_create_day_night(
        actor=actor,
        pool=pool,
        name="lab day/night",
        time_zone="Europe/Berlin",
        day_profile=day,
        night_profile=night,
        day_qos_policy=inference,
        night_qos_policy=training,
        wait_minutes=1,
    )
    sim = Simulator(nodes=2, seed=SEED, apply_delay=0.0, workload_pods=0)
    with sim, web_server(tmp_path, TESSERA_AGENT_INTERVAL_SECONDS="1") as url:
        serving = _kubernetes_pool_requiring_guaranteed(actor, sim, inference)
        proc, log = simulated_agent(url, tmp_path / "state", tmp_path, seed=SEED, join_token=join_token)
        try:
            node = wait_until(
                lambda: Node.objects.filter(cluster=cluster, name=HOSTNAME, last_seen_at__isnull=False).first(),
                timeout=20,
                message="the agent to register and report",
            )
            Node.objects.filter(pk=node.pk).update(pool=pool)

            # The schedule's next transition after noon: 20:00 in Berlin (CET), day → night for the one node.
            transition = scheduling_selectors.schedule_transitions(schedule, NOON, NOON + timedelta(days=1))[0]
            assert transition.at == datetime(2026, 3, 4, 19, 0, tzinfo=UTC)
            assert (transition.from_profile, transition.to_profile, transition.nodes) == (day, night, 1)
            assert (transition.from_qos, transition.to_qos) == (inference, training)
            night_time = transition.at + timedelta(minutes=1)

            # Day: MIG 3g.40gb ×2 with the inference policy (THP madvise, no locked clocks).
            (day_rollout,) = reconcile.reconcile(at=NOON)
            assert Rollout.objects.filter(pk=day_rollout, trigger="schedule", actor_label=schedule.name).exists()
            day_change = _succeeded(day_rollout, "the agent to apply the day config and the change to verify")
            node.refresh_from_db()
            assert node.host_settings["thp"] == "madvise"
            assert node.agent_node_settings == {"gpu": {}, "host": {"transparent_hugepages": "madvise"}}
            assert node.agent_config_id == day_change.to_config["config_id"]
            assert node.allocatable == {"nvidia.com/mig-3g.40gb": 4}
            for gpu in Gpu.objects.filter(node=node):
                assert gpu.mig_enabled
                assert list(MigDevice.objects.filter(gpu=gpu).values_list("profile", flat=True)) == ["3g.40gb"] * 2
            assert reconcile.reconcile(at=NOON) == []  # in sync by day

            # Night: one rollout switches the profile and the QoS policy together.
            (night_rollout,) = reconcile.reconcile(at=night_time)
            assert Rollout.objects.filter(pk=night_rollout, trigger="schedule", profile=night).exists()
            planned = NodeChange.objects.get(rollout_id=night_rollout)
            assert planned.to_config["profile"] == night.name
            assert planned.to_config["node_settings"] == training.node_settings()
            night_change = _succeeded(night_rollout, "the agent to apply the night config and the change to verify")
            config_id = night_change.to_config["config_id"]
            assert config_id != day_change.to_config["config_id"]

            # What the agent reported is what the server stores: THP always, the locked clocks it applied.
            node.refresh_from_db()
            assert node.host_settings["thp"] == "always"
            assert node.agent_config_id == config_id
            assert node.agent_node_settings == {
                "gpu": {"gpu_clock_min_mhz": TRAINING_CLOCKS[0], "gpu_clock_max_mhz": TRAINING_CLOCKS[1]},
                "host": {"transparent_hugepages": "always"},
            }
            assert node.allocatable == {"nvidia.com/gpu": 2}
            for gpu in Gpu.objects.filter(node=node):
                assert not gpu.mig_enabled and not MigDevice.objects.filter(gpu=gpu).exists()
                # NVML cannot read locked clocks back; the GPU's own range, as reported, holds the locked one.
                assert gpu.settings["max_graphics_clock_mhz"] >= TRAINING_CLOCKS[1]
            agent_log = (tmp_path / "agent.log").read_text()
            assert f"config {config_id} (change {night_change.pk}) succeeded" in agent_log
            assert "GPU clocks locked to 1410-1980 MHz" in agent_log
            assert reconcile.reconcile(at=night_time) == []  # in sync by night

            # The audit trail: the schedule's rollout, then the settings the agent reported changed.
            reported = AuditEvent.objects.filter(
                action="node.settings_reported", object_type="node", object_id=str(node.pk)
            )
            assert [(e.actor_label, e.before, e.after) for e in reported] == [
                ("tessera-agent", {"host.thp": "madvise"}, {"host.thp": "always"})
            ]
            assert f"after applying config {config_id}" in reported.get().message
            assert AuditEvent.objects.filter(
                action="rollout.create", object_id=str(night_rollout), actor_kind="schedule", actor_label=schedule.name
            ).exists()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert finish(proc, log) == 0

        _compliance_names_the_best_effort_pod(sim, serving, inference)


def _kubernetes_pool_requiring_guaranteed(actor, sim, policy):
    """A Kubernetes cluster on the simulator, synced, with one pool of its nodes under `policy` (by default)."""
    k8s_cluster = ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path, metrics_url=f"{sim.url}/metrics")
    sync_cluster_full(k8s_cluster)
    serving = NodePoolFactory(cluster=k8s_cluster, name="serving")
    assert Node.objects.filter(cluster=k8s_cluster).update(pool=serving) == 2
    sharing_services.pool_set_qos_policy(actor=actor, pool=serving, policy=policy)
    return serving


def _compliance_names_the_best_effort_pod(sim, serving, policy):
    first, second = sorted(sim.nodes)
    sim.store.create(PODS, _gpu_pod("svc-besteffort", first))
    sim.store.create(PODS, _gpu_pod("svc-guaranteed", second, {"cpu": "2", "memory": "8Gi"}))
    assert sync_pods(serving.cluster) == 2

    qos_compliance_refresh()  # beat's tick: one check per pool, run in process (eager)
    report = QoSComplianceReport.objects.get(pool=serving)
    assert (report.policy, report.pods_checked, report.violation_count) == (policy, 2, 1), report.violations
    (violation,) = report.violations
    assert (violation["namespace"], violation["name"], violation["node"], violation["rule"]) == (
        "inference",
        "svc-besteffort",
        first,
        "qos",
    )
    assert violation["message"] == "QoS class BestEffort; the pool requires Guaranteed"
