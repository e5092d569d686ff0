"""The agent lab of `make run`: cluster demo-lab, driven by Tessera's own node agent over simulated NVML
(`python -m agent.fleet`), with a selector pool for its H100 nodes. No GPU Operator: the agents apply the settings.

The agents' credentials live in var/agents and are reused across restarts; a new database starts them afresh.
"""

import shutil
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from agent.runner import load_credential
from core.audit import Actor
from fleet import services as fleet_services
from fleet.agent_credentials import agent_join_token_create
from fleet.models import Cluster, NodePool

LAB_CLUSTER, LAB_POOL = "demo-lab", "lab-h100"
ACTOR = Actor.system("make run")
LAB_PRODUCT = "NVIDIA-H100-80GB-HBM3"  # agent.backends.simulated's default product
LAB_TOKEN_LIFETIME = timedelta(hours=1)  # only agents without a stored credential use it, at start-up


def agent_lab_command(*, python: str, server: str, count: int) -> list[str]:
    """Register cluster demo-lab and its pool (idempotent) and return the command that runs `count` simulated
    agents against `server`, with a join token when some of them have no credential for it yet."""
    state_root = settings.VAR_DIR / "agents"
    cluster = _lab_cluster(state_root)
    _ensure_lab_pool(cluster)
    command = [python, "-m", "agent.fleet", "--server", server, "--count", str(count),
               "--state-root", str(state_root), "--product", LAB_PRODUCT]  # fmt: skip
    if server.startswith("http://"):
        command.append("--insecure-lab")  # the lab's own web server on this machine; agents refuse http:// otherwise
    token = _join_token_for_new_agents(cluster, server, count, state_root)
    return [*command, "--join-token", token] if token else command


def _lab_cluster(state_root: Path) -> Cluster:
    """Cluster demo-lab (agent driver); when it is created, the credentials of a former database are removed."""
    cluster = Cluster.objects.filter(name=LAB_CLUSTER).first()
    if cluster is not None:
        return cluster
    cluster = fleet_services.cluster_create(
        actor=ACTOR,
        name=LAB_CLUSTER,
        description="Simulated nodes driven by Tessera's node agent, started by `make run` (python -m agent.fleet).",
        driver="agent",
    )
    shutil.rmtree(state_root, ignore_errors=True)  # credentials of a former database are refused
    return cluster


def _ensure_lab_pool(cluster: Cluster) -> None:
    if not NodePool.objects.filter(cluster=cluster, name=LAB_POOL).exists():
        fleet_services.pool_create(
            actor=ACTOR,
            cluster=cluster,
            name=LAB_POOL,
            description="The lab's H100 nodes (selector on the GPU Feature Discovery label the agents report).",
            node_selector=f"nvidia.com/gpu.product={LAB_PRODUCT}",
        )


def _join_token_for_new_agents(cluster: Cluster, server: str, count: int, state_root: Path) -> str:
    """A join token for the agents without a credential for this server ("" when every one has one)."""
    registered = sum(load_credential(d, server) is not None for d in state_root.glob("*") if d.is_dir())
    if registered >= count:
        return ""
    _, token = agent_join_token_create(
        actor=ACTOR,
        cluster=cluster,
        name=f"make run {time.strftime('%Y-%m-%d %H:%M')}",
        description="Joins the simulated agents of the demo lab.",
        expires_at=timezone.now() + LAB_TOKEN_LIFETIME,
        max_uses=count - registered,
    )
    return token
