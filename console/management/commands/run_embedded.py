"""`make run`: migrate, ensure an admin login, start the simulated GPU fleet and register it, then supervise
web + worker + beat + the cluster watcher + the simulator + a lab of simulated node agents until Ctrl-C.

The simulator (`python -m simulator`, an emulated Kubernetes API with NVIDIA's GPU Operator) is the live demo:
the UI shows what the watcher reads from it. The agent lab (`python -m agent.fleet`, agents/lab.py) is a second
cluster, demo-lab, driven by Tessera's own node agent over simulated NVML: no GPU Operator, settings applied by the
agents. The old seeded rows (`seed_demo`) only come with --with-seed-demo.
"""

import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from django.urls import reverse

from agents.lab import LAB_CLUSTER, LAB_POOL, agent_lab_command
from console import demo_schedule
from console.supervisor import ChildSpec, Chore, Supervisor
from core.audit import Actor
from core.embedded import status_path
from core.roles import Role
from fleet import services as fleet_services
from fleet.models import Cluster, Node, NodePool
from worker.drivers import driver_for
from worker.drivers.base import DriverError
from worker.drivers.kubernetes.api import forget_client

SIM_CLUSTER = "demo-sim"
SIM_START_SECONDS = 60
DEMO_EXTEND_SECONDS = 300


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(url: str, ca_path=None) -> bool:
    """`url`/healthz answers 200 (over HTTPS trusting `ca_path`, the simulator's own certificate)."""
    try:
        context = ssl.create_default_context(cafile=str(ca_path)) if ca_path else None
        with urllib.request.urlopen(url + "/healthz", timeout=2, context=context) as reply:
            return reply.status == 200
    except (OSError, ssl.SSLError):
        return False


def _child_env() -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings.local"),
    }


def _server_commands(python: str, host: str, port: int, access_log: Path) -> dict[str, list[str]]:
    """The commands of Tessera itself: the web server, a Celery worker and beat. The terminal is a status: warnings,
    errors and rollouts starting or ending (logger tessera.rollouts); requests go to `access_log`, bounded in size
    (console/access_log.py), and Celery's banners and per-task lines are left out."""
    bindir = os.path.dirname(python)
    return {
        "web": [os.path.join(bindir, "gunicorn"), "config.wsgi", "--bind", f"{host}:{port}", "--workers", "2",
                "--threads", "4", "--log-level", "warning", "--access-logfile", str(access_log),
                "--logger-class", "console.access_log.BoundedAccessLog"],
        "worker": [os.path.join(bindir, "celery"), "-A", "config", "--quiet", "worker", "-l", "WARNING",
                   "--concurrency", "2", "-n", "tessera-worker@%h"],
        "beat": [os.path.join(bindir, "celery"), "-A", "config", "--quiet", "beat", "-l", "WARNING"],
    }  # fmt: skip


def _wait_for_simulator(proc: subprocess.Popen, url: str, kubeconfig: Path, ca_path: Path) -> None:
    """Until the simulator wrote its kubeconfig and answers; raises when it exits or stays silent."""
    deadline = time.monotonic() + SIM_START_SECONDS
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the simulator exited with status {proc.returncode}")
        if kubeconfig.exists() and _answers(url, ca_path):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the simulator did not answer within {SIM_START_SECONDS} s")
        time.sleep(0.2)


def _wait_for_web(proc: subprocess.Popen, url: str) -> None:
    """Until the web server answers /healthz; raises when it exits or stays silent."""
    deadline = time.monotonic() + SIM_START_SECONDS
    while not _answers(url):
        if proc.poll() is not None:
            raise RuntimeError(f"the web server exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the web server did not answer within {SIM_START_SECONDS} s")
        time.sleep(0.2)


def _register_simulator(url: str, kubeconfig: Path) -> Cluster:
    """Cluster demo-sim pointing at the simulator (created once, then updated to this start's port and token)."""
    values = {
        "description": "Simulated GPU fleet started by `make run` (python -m simulator).",
        "driver": "kubernetes",
        "kubeconfig_path": str(kubeconfig),
        "in_cluster": False,
        "operator_namespace": "gpu-operator",
        "metrics_url": f"{url}/metrics",
    }
    cluster = Cluster.objects.filter(name=SIM_CLUSTER).first()
    if cluster is None:
        cluster = fleet_services.cluster_create(actor=Actor.system("make run"), name=SIM_CLUSTER, **values)
    else:  # a new port, certificate and token every start: the update also renews the cached API client
        cluster = fleet_services.cluster_update(actor=Actor.system("make run"), cluster=cluster, **values)
    forget_client(cluster.pk)
    return cluster


class Command(BaseCommand):
    help = (
        "Run Tessera's embedded default in one command: web server, Celery worker and beat, the cluster watcher and "
        "a simulated GPU fleet."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("TESSERA_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("TESSERA_PORT", "8000")))
        parser.add_argument(
            "--with-seed-demo", action="store_true", help="Also seed the static demo rows into an empty database."
        )
        parser.add_argument("--no-sim", action="store_true", help="Do not start the simulated GPU fleet.")
        parser.add_argument(
            "--no-demo-schedule",
            action="store_true",
            default=os.environ.get("TESSERA_DEMO_SCHEDULE", "1") == "0",
            help="No demo schedule: pool demo-day-night, switching every few minutes, is not made (or is switched "
            "off). Also TESSERA_DEMO_SCHEDULE=0.",
        )
        parser.add_argument("--sim-nodes", type=int, default=int(os.environ.get("TESSERA_SIM_NODES", "60")))
        parser.add_argument("--sim-port", type=int, default=int(os.environ.get("TESSERA_SIM_PORT", "0")))
        parser.add_argument(
            "--sim-agents",
            type=int,
            default=int(os.environ.get("TESSERA_SIM_AGENTS", "4")),
            help="Simulated node agents in cluster demo-lab (0: none).",
        )

    def handle(
        self, *args, host, port, with_seed_demo, no_sim, no_demo_schedule, sim_nodes, sim_port, sim_agents, **options
    ):
        login = self._prepare_database(with_seed_demo)
        python, env = sys.executable, _child_env()
        banner: list[str] = []
        self.demo_schedule = not no_sim and not no_demo_schedule
        self.demo_pool = None
        specs = [] if no_sim else [self._simulator_spec(python, env, sim_nodes, sim_port or _free_port(), banner)]
        local = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        access_log = settings.VAR_DIR / "log" / "access.log"
        access_log.parent.mkdir(mode=0o700, exist_ok=True)
        server = _server_commands(python, host, port, access_log)
        # The parts after the web server (the agents first) find it answering.
        specs.append(
            ChildSpec("web", server["web"], env, after_start=lambda p: _wait_for_web(p, f"http://{local}:{port}"))
        )
        specs += [ChildSpec("worker", server["worker"], env), ChildSpec("beat", server["beat"], env)]
        if not no_sim:
            watch = [python, str(settings.BASE_DIR / "manage.py"), "watch_clusters", "--rescan", "10"]
            specs.append(ChildSpec("watcher", watch, env))
        if not no_sim and sim_agents > 0:
            lab = agent_lab_command(python=python, server=f"http://{local}:{port}", count=sim_agents)
            specs.append(ChildSpec("agents", lab, env, essential=False))
            banner.append(f"Agent lab: cluster {LAB_CLUSTER}, {sim_agents} simulated agent nodes in pool {LAB_POOL}")
        chores = [Chore("Extending the demo schedule", DEMO_EXTEND_SECONDS, self._extend_demo)]
        chores = chores if self.demo_schedule else []
        supervisor = Supervisor(specs, status_path=status_path(), log=self.stderr.write, chores=chores)
        try:
            supervisor.start_all()
        except (Exception, KeyboardInterrupt) as exc:
            supervisor.stop_all()
            if isinstance(exc, KeyboardInterrupt):
                return
            raise CommandError(f"Start-up failed: {exc}") from exc
        self._show_banner(f"http://{host}:{port}/", login, banner)
        if supervisor.run():
            raise CommandError(f"Stopped: {', '.join(supervisor.failed)} kept failing (see the log above).")
        self.stdout.write("Stopped.")

    def _prepare_database(self, with_seed_demo: bool) -> str:
        """Migrate, collect static files, ensure the admin login (returns its banner line), seed when asked."""
        settings.VAR_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        login = self._ensure_admin()
        if with_seed_demo and not Node.objects.exists():
            self.stdout.write("Seeding the demo fleet…")
            call_command("seed_demo")
        return login

    def _show_banner(self, url: str, login: str, banner: list[str]) -> None:
        self.stdout.write(self.style.SUCCESS(f"\nTessera is running at {url}"))
        self.stdout.write(login)
        for line in banner:
            self.stdout.write(line)
        if self.demo_pool:
            path = reverse("console:pool_detail", args=[self.demo_pool.pk])
            self.stdout.write(
                f"Watch a day/night switch: {url.rstrip('/')}{path} (pool {demo_schedule.POOL}: the next switch, the "
                "rollout in progress, what runs until when)"
            )
            self.stdout.write(
                f"  its nodes: kubectl --kubeconfig {self.demo_pool.cluster.kubeconfig_path} get nodes "
                f"-l '{self.demo_pool.node_selector}' -L {demo_schedule.MIG_LABELS} -w"
            )
        self.stdout.write("API docs: " + url + "api/docs/   Stop: Ctrl-C\n")

    def _extend_demo(self) -> None:
        close_old_connections()
        cluster = Cluster.objects.filter(name=SIM_CLUSTER).first()
        if cluster is not None:
            demo_schedule.demo_schedule_extend(cluster.pk)

    def _simulator_spec(self, python: str, env: dict, nodes: int, port: int, banner: list[str]) -> ChildSpec:
        """The simulated fleet: before each start its old kubeconfig goes; after it, Tessera waits for it, registers
        it as cluster demo-sim (idempotent: a new certificate and token each start) and points its ClusterPolicy at
        Tessera's ConfigMaps. Fills the banner lines."""
        sim_dir = settings.VAR_DIR / "sim"
        sim_dir.mkdir(parents=True, exist_ok=True)
        kubeconfig = sim_dir / "kubeconfig"
        url = f"https://127.0.0.1:{port}"
        cmd = [python, "-m", "simulator", "--port", str(port), "--nodes", str(nodes), "--seed", "7",
               "--write-kubeconfig", str(kubeconfig), "--state-dir", str(sim_dir), "--apply-delay", "3"]  # fmt: skip

        def after_start(proc: subprocess.Popen) -> None:
            _wait_for_simulator(proc, url, kubeconfig, sim_dir / "apiserver.crt")
            cluster = _register_simulator(url, kubeconfig)
            try:
                for line in driver_for(cluster).adopt_operator_configs():
                    self.stdout.write(f"  {line}")
            except DriverError as exc:  # the fleet still shows; rollouts wait for the ClusterPolicy (the UI says why)
                self.stderr.write(f"  Could not point the ClusterPolicy at Tessera's ConfigMaps: {exc}")
            self._seed_demo_schedule(cluster)

        self.stdout.write(f"Starting the simulated GPU fleet ({nodes} nodes)…")
        columns = "nvidia.com/gpu.product,nvidia.com/mig.config,nvidia.com/mig.config.state"
        banner += [
            f"Simulated fleet: cluster {SIM_CLUSTER}, {nodes} nodes at {url}",
            f"  kubeconfig: {kubeconfig}",
            f"  try: kubectl --kubeconfig {kubeconfig} get nodes -L {columns}",
        ]
        return ChildSpec(
            "simulator", cmd, env, essential=False, stop_last=True,
            before_start=lambda: kubeconfig.unlink(missing_ok=True), after_start=after_start,
        )  # fmt: skip

    def _seed_demo_schedule(self, cluster: Cluster) -> None:
        """The demo pool and its fast schedule (console/demo_schedule.py); a failure is a warning, never the end."""
        try:
            self.stdout.write(demo_schedule.demo_schedule_seed(cluster, enabled=self.demo_schedule))
        except Exception as exc:  # noqa: BLE001 - the demo around Tessera must not stop it
            self.stderr.write(f"Could not make the demo schedule: {exc}")
            return
        pool = NodePool.objects.filter(cluster=cluster, name=demo_schedule.POOL).select_related("cluster").first()
        self.demo_pool = pool if self.demo_schedule else None

    def _ensure_admin(self) -> str:
        """Create the admin login once: from TESSERA_ADMIN_USERNAME/PASSWORD (refused unless the password validators
        accept it), or a generated password shown once on the terminal. When the output is no terminal (a log file,
        a service manager) the generated password goes to a file only its owner reads, never into the output."""
        username = os.environ.get("TESSERA_ADMIN_USERNAME", "admin")
        user_model = get_user_model()
        if user_model.objects.filter(username=username).exists():
            return f"Login: {username} (password as set before; change it with `make admin-password`)"
        given = os.environ.get("TESSERA_ADMIN_PASSWORD")
        password = given or secrets.token_urlsafe(16)
        try:
            validate_password(password, user_model(username=username))
        except ValidationError as exc:
            raise CommandError(f"TESSERA_ADMIN_PASSWORD refused: {' '.join(exc.messages)}") from None
        user = user_model.objects.create_superuser(username=username, email="", password=password)
        user.groups.add(Group.objects.get(name=Role.ADMIN.group_name))
        if given:
            return f"Login: {username} / (from TESSERA_ADMIN_PASSWORD)"
        if self.stdout.isatty():
            return f"Login: {username} / {password}   (shown once; change it with `make admin-password`)"
        secret_file = settings.VAR_DIR / "admin-password"
        with os.fdopen(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write(password + "\n")
        return f"Login: {username} / the password in {secret_file} (not a terminal: kept out of this output)"
