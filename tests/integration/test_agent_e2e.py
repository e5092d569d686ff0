"""End to end: a real Tessera server (gunicorn) and the real agent process (`python -m agent --simulate`).

The agent registers with a join token, reports its GPUs, applies the MIG layout a rollout gives it and the change
is verified from what it reports; stopped, its node goes stale; a credential used by another node is refused, and
after revocation the agent exits with code 3 and the server's message. A machine holding the join token and naming
itself after a registered node waits for an admin (so does the node's own agent after losing its state).
"""

import shutil
import signal

import pytest

from core.audit import Actor
from fleet import agent_credentials
from fleet.models import Gpu, MigDevice, Node, PendingAgent
from sharing import services as sharing_services
from sharing.mig import get_product
from tests.factories import ClusterFactory, NodePoolFactory, UserFactory
from tests.processes import finish, simulated_agent, wait_until, web_server
from worker import reconcile
from worker.choices import ChangeStatus
from worker.models import NodeChange, Rollout
from worker.selectors import reconcilable_nodes

pytestmark = [
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored"),
]
H100 = "NVIDIA-H100-80GB-HBM3"
SEED = 7
HOSTNAME = f"sim-node-{SEED}"  # the simulated host's name for this seed


def test_agent_registers_applies_a_rollout_goes_stale_and_is_revoked(tmp_path, settings):
    settings.TESSERA = {**settings.TESSERA, "AGENT_INTERVAL_SECONDS": 1}  # stale after 3 missed seconds
    admin = UserFactory(username="admin", role="admin")
    actor = Actor.for_user(admin)
    cluster = ClusterFactory(name="lab", driver="agent", kubeconfig_path="")
    _, join_token = agent_credentials.agent_join_token_create(actor=actor, cluster=cluster, name="lab")
    state_dir = tmp_path / "state"

    with web_server(tmp_path, TESSERA_AGENT_INTERVAL_SECONDS="1") as url:
        proc, log = simulated_agent(url, state_dir, tmp_path, seed=SEED, join_token=join_token)
        try:
            node = wait_until(
                lambda: Node.objects.filter(cluster=cluster, name=HOSTNAME, last_seen_at__isnull=False).first(),
                timeout=20,
                message="the agent to register and report",
            )
            assert Gpu.objects.filter(node=node).count() == 2
            assert (state_dir / "credential.json").stat().st_mode & 0o777 == 0o600

            # A MIG layout for the node's pool, rolled out by the engine (eager tasks, here and in the server).
            pool = NodePoolFactory(cluster=cluster, name="inference")
            Node.objects.filter(pk=node.pk).update(pool=pool)
            profile = sharing_services.profile_create(
                actor=actor, name="mig-3g", mode="mig", target_products=[H100], mig_layouts={"all": {"3g.40gb": 2}}
            )
            sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)  # runs a reconcile tick
            rollout_id = Rollout.objects.get(pool=pool).pk
            change = wait_until(
                lambda: NodeChange.objects.filter(rollout_id=rollout_id, status=ChangeStatus.SUCCEEDED).first(),
                timeout=30,
                message="the agent to apply the MIG layout and the change to be verified",
            )
            assert Rollout.objects.get(pk=rollout_id).status == "succeeded"
            node.refresh_from_db()
            assert node.observed_mig_config == change.to_config["mig_config"] and node.config_state == "success"
            assert node.allocatable == change.to_config["allocatable"] == {"nvidia.com/mig-3g.40gb": 4}
            profile_3g = get_product(H100).mig_profile("3g.40gb")
            for gpu in Gpu.objects.filter(node=node):
                assert gpu.mig_enabled
                placed = list(
                    MigDevice.objects.filter(gpu=gpu).order_by("start").values_list("profile", "start", "size")
                )
                assert placed == [("3g.40gb", start, profile_3g.memory_slices) for start in (0, 4)]
                assert all(
                    uuid.startswith("MIG-") for uuid in MigDevice.objects.filter(gpu=gpu).values_list("uuid", flat=True)
                )
            assert reconcile.reconcile() == []  # in sync: nothing more to do

            # Node A's credential in another node's hands is refused: it can only report for node A.
            other_state = tmp_path / "other"
            other_state.mkdir(mode=0o700)
            shutil.copy(state_dir / "credential.json", other_state / "credential.json")
            other, other_log = simulated_agent(
                url, other_state, tmp_path, "--hostname", "intruder", "--once", seed=SEED, name="other"
            )
            assert finish(other, other_log) == 3
            assert f"belongs to node {HOSTNAME}" in (tmp_path / "other.log").read_text()
            assert not Node.objects.filter(name="intruder").exists()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert finish(proc, log) == 0

        wait_until(lambda: Node.objects.stale().filter(pk=node.pk).exists(), timeout=10, message="the node to go stale")
        assert not reconcilable_nodes().filter(pk=node.pk).exists()

        agent_credentials.node_agent_revoke(actor=actor, node=node)
        proc, log = simulated_agent(url, state_dir, tmp_path, seed=SEED, name="revoked")
        assert finish(proc, log) == 3
        output = (tmp_path / "revoked.log").read_text()
        assert "the server refused the agent credential: Agent credential revoked or unknown." in output
        assert join_token not in output


def test_a_join_token_alone_does_not_take_over_a_node_and_a_reinstalled_agent_waits_for_approval(tmp_path):
    admin = UserFactory(username="admin", role="admin")
    actor = Actor.for_user(admin)
    cluster = ClusterFactory(name="lab", driver="agent", kubeconfig_path="")
    _, join_token = agent_credentials.agent_join_token_create(actor=actor, cluster=cluster, name="lab")
    with web_server(tmp_path, TESSERA_AGENT_INTERVAL_SECONDS="1") as url:
        proc, log = simulated_agent(url, tmp_path / "state", tmp_path, seed=SEED, join_token=join_token)
        try:
            node = wait_until(
                lambda: Node.objects.filter(name=HOSTNAME, last_seen_at__isnull=False).first(),
                timeout=20,
                message="the agent to register and report",
            )
            # Another machine with the shared join token names itself after the node: it is told to wait.
            impostor, impostor_log = simulated_agent(
                url, tmp_path / "impostor", tmp_path, "--hostname", HOSTNAME, "--once",
                seed=SEED + 1, join_token=join_token, name="impostor",
            )  # fmt: skip
            assert finish(impostor, impostor_log) == 1
            (impostor_request,) = PendingAgent.objects.filter(node=node)
            assert f"approve request {impostor_request.fingerprint}" in (tmp_path / "impostor.log").read_text()
            seen = Node.objects.get(pk=node.pk).agent_last_seen_at
            wait_until(
                lambda: Node.objects.get(pk=node.pk).agent_last_seen_at > seen,
                timeout=10,
                message="the real agent to keep reporting",
            )
            # The node's machine reinstalled (its state lost): approved by its fingerprint, it takes over.
            again, again_log = simulated_agent(
                url, tmp_path / "reinstalled", tmp_path, seed=SEED, join_token=join_token, name="reinstalled"
            )
            try:
                wanted = wait_until(
                    lambda: PendingAgent.objects.filter(node=node).exclude(pk=impostor_request.pk).first(),
                    timeout=20,
                    message="the reinstalled agent to ask for approval",
                )
                wait_until(
                    lambda: f"approve request {wanted.fingerprint}" in (tmp_path / "reinstalled.log").read_text(),
                    timeout=10,
                    message="the reinstalled agent to log the fingerprint the admin approves",
                )
                agent_credentials.pending_agent_decide(actor=actor, pending=wanted, approve=True)
                assert finish(proc, log, timeout=20) == 3  # the old credential is revoked when the new one is issued
                wait_until(
                    lambda: (tmp_path / "reinstalled" / "credential.json").exists(),
                    timeout=20,
                    message="the approved agent to collect its credential",
                )
            finally:
                again.send_signal(signal.SIGTERM)
                assert finish(again, again_log) == 0
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                finish(proc, log)
    assert PendingAgent.objects.get(pk=wanted.pk).status == "completed"
