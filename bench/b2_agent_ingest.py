"""B2: node agent reports ingested per second by Tessera under gunicorn, beside a bare Django view as the floor.

Run: .venv/bin/python -m bench.b2_agent_ingest [--agents 200 --seconds 10] [--rounds 2] [--quick]
Targets: at least 1,500 reports/s, and at least 50 % of the floor's rate in the same run.

Both servers run the same gunicorn command (2 gthread workers) and settings; the floor only swaps ROOT_URLCONF for
this module's `urlpatterns`: one view that parses the report JSON and answers 204. The clients are light on
purpose (they share the 2 cores): prepared request bytes from the simulated backend's reports, one kept-alive
socket per agent, one thread per agent in a few processes.
"""

import argparse
import dataclasses
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from bench.common import setup_django, verdict

TARGET_RATE = 1500
TARGET_SHARE = 0.5
REPORT_PATH = "/api/v1/agent/report/"
SNAPSHOTS = 6  # reports per agent, 15 simulated seconds apart, sent in turn: metrics move, jobs come and go
MIG_LAYOUT = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}
ROOT = Path(__file__).resolve().parents[1]


# --- the floor: parse the same JSON, answer 204 (served as "bench.b2_agent_ingest:floor_app()") ------------------


@csrf_exempt
def floor_report(request):
    json.loads(request.body)
    return HttpResponse(status=204)


def floor_health(request):
    return JsonResponse({"status": "ok"})


urlpatterns = [path(REPORT_PATH.lstrip("/"), floor_report), path("healthz", floor_health)]


def floor_app():
    """The WSGI application of the floor: Tessera's settings and middleware, this module as ROOT_URLCONF."""
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application

    application = get_wsgi_application()
    settings.ROOT_URLCONF = __name__
    return application


# --- seeding -------------------------------------------------------------------------------------------------------


def seed(agents: int, mig_every: int) -> list[tuple[str, list[bytes]]]:
    """Register the agents (an agent cluster, one join token) and precompute their report bodies."""
    from agent.backends.simulated import SimulatedBackend
    from agent.protocol import MigSettings, Report, inventory_digest
    from agents.credentials import agent_register
    from core.audit import Actor
    from fleet.agent_credentials import agent_join_token_create
    from fleet.models import Cluster
    from sharing.render import MigDeviceSpec, render_mig_parted_config

    cluster = Cluster.objects.create(name="bench", driver="agent")
    _, join_token = agent_join_token_create(actor=Actor.system("bench"), cluster=cluster, name="b2")
    clients = []
    for seed_ in range(agents):
        clock = [1000.0]
        backend = SimulatedBackend(seed=seed_, gpus=8, clock=lambda clock=clock: clock[0])
        try:
            if mig_every and seed_ % mig_every == 0:
                backend.sim.workload = False  # jobs keep a GPU from changing its MIG mode
                layout = render_mig_parted_config({"layout": [MigDeviceSpec("all", True, MIG_LAYOUT)]})
                backend.apply_mig(backend.plan_mig(MigSettings(layout, "layout")))
                backend.sim.workload = True
            bodies = []
            for _ in range(SNAPSHOTS):
                clock[0] += 15
                snapshot = backend.snapshot()
                report = Report(
                    agent_version="0.1.0",
                    hostname=snapshot.hostname,
                    driver_version=snapshot.driver_version,
                    cuda_version=snapshot.cuda_version,
                    numa_nodes=snapshot.numa_nodes,
                    gpus=snapshot.gpus,
                    xid_events=(),
                    host=snapshot.host,
                    applied=None,
                )
                # As the agent sends it (agent/runner.py): with its inventory digest.
                report = dataclasses.replace(report, inventory_digest=inventory_digest(report))
                bodies.append(json.dumps(report.to_dict()).encode())
        finally:
            backend.close()
        registration = agent_register(join_token=join_token, hostname=snapshot.hostname, agent_version="0.1.0")
        clients.append((registration.credential, bodies))
    return clients


def inventory_change_share(clients) -> float:
    """How many reports carry inventory that differs from the same agent's previous report (MIG jobs moving)."""
    from agent.protocol import Report, inventory_digest

    changed = total = 0
    for _, bodies in clients:
        digests = [inventory_digest(Report.from_dict(json.loads(body))) for body in bodies]
        changed += sum(1 for i, digest in enumerate(digests) if digest != digests[i - 1])
        total += len(digests)
    return changed / total


# --- servers and clients ------------------------------------------------------------------------------------------


def database_url(connection) -> str:
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """gunicorn serving `app` with the benchmark's worker settings, until stopped."""

    def __init__(self, app: str, args, db_url: str, scratch: str):
        self.port = free_port()
        self.log_path = Path(scratch) / f"gunicorn-{self.port}.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.local",
            "DJANGO_DEBUG": "false",
            "DJANGO_SECRET_KEY": "b2-benchmark-not-a-secret",
            "DATABASE_URL": db_url,
            "TESSERA_VAR_DIR": scratch,
            # The throttle runs on every request but must not cap a benchmark that reports hundreds of times a
            # second per agent.
            "TESSERA_AGENT_THROTTLE": "100000000/min",
            "DJANGO_LOG_LEVEL": "WARNING",
        }
        cmd = [sys.executable, "-m", "gunicorn", app, "--bind", f"127.0.0.1:{self.port}", "--workers",
               str(args.workers), "--worker-class", args.worker_class, "--threads", str(args.threads),
               "--backlog", "2048", "--keep-alive", "30", "--log-level", "warning"]  # fmt: skip
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"gunicorn exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"gunicorn did not answer: {self.log_path.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class KeepAliveClient:
    """HTTP/1.1 over one kept-alive socket, as light as a client can be: each request is prepared bytes, and a
    response is read only as far as its status line and length (http.client parses every header through the
    email package, which costs the shared cores more than the floor's whole view)."""

    def __init__(self, port: int):
        self.port = port
        self.sock = None
        self.buffer = b""

    def _connect(self):
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def request(self, raw: bytes) -> int:
        """Send one prepared request; returns the status, 0 when the connection failed."""
        try:
            if self.sock is None:
                self._connect()
            self.sock.sendall(raw)
            while b"\r\n\r\n" not in self.buffer:
                self._fill()
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            status = int(head[9:12])
            lower = head.lower()
            length = 0
            if b"content-length:" in lower:
                length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            elif b"transfer-encoding: chunked" in lower:
                while not rest.endswith(b"0\r\n\r\n"):
                    rest += self._recv()
                length = len(rest)
            while len(rest) < length:
                rest += self._recv()
            self.buffer = rest[length:]
            if b"connection: close" in lower:
                self.close()
            return status
        except (OSError, ValueError):
            self.close()
            return 0

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        return chunk

    def _fill(self):
        self.buffer += self._recv()


def prepared_requests(port: int, credential: str, bodies: list[bytes]) -> list[bytes]:
    head = (
        f"POST {REPORT_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {credential}\r\n"
        "Content-Type: application/json\r\nAccept: application/json\r\n"
    )
    return [f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body for body in bodies]


def _client_process(port, agents, start_at, measure_from, stop_at, results):
    """One load process: a thread per agent, each with one keep-alive connection, sending its reports in turn."""
    totals = {"ok": 0, "refused": 0, "errors": 0, "latencies": []}
    lock = threading.Lock()

    def run(credential, bodies):
        requests = prepared_requests(port, credential, bodies)
        client = KeepAliveClient(port)
        ok = refused = errors = 0
        latencies = []
        i = 0
        time.sleep(max(0.0, start_at - time.time()))
        while True:
            sent = time.time()
            if sent >= stop_at:
                break
            status = client.request(requests[i % len(requests)])
            i += 1
            done = time.time()
            if measure_from <= done < stop_at:
                if 200 <= status < 300:
                    ok += 1
                    latencies.append(done - sent)
                elif status:
                    refused += 1
                else:
                    errors += 1
        client.close()
        with lock:
            totals["ok"] += ok
            totals["refused"] += refused
            totals["errors"] += errors
            totals["latencies"].extend(latencies[::10])

    threads = [threading.Thread(target=run, args=agent) for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(totals)


def _cpu_seconds(pids) -> float:
    """User + system CPU of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def load(server: "Server", clients, args) -> dict:
    """Run every agent against the server: warm-up, then `seconds` counted; returns the totals and the server's CPU
    per report over the counted seconds."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    start_at = time.time() + 1.5  # the spawned processes start before anyone sends
    measure_from = start_at + args.warmup
    stop_at = measure_from + args.seconds
    shares = [clients[i :: args.client_processes] for i in range(args.client_processes)]
    procs = [
        context.Process(target=_client_process, args=(server.port, share, start_at, measure_from, stop_at, results))
        for share in shares
    ]
    for proc in procs:
        proc.start()
    pids = [server.proc.pid, *_children(server.proc.pid)]
    time.sleep(max(0.0, measure_from - time.time()))
    cpu_before = _cpu_seconds(pids)
    time.sleep(max(0.0, stop_at - time.time()))
    cpu = _cpu_seconds(pids) - cpu_before
    load_average = os.getloadavg()[0]
    parts = [results.get(timeout=args.warmup + args.seconds + 120) for _ in procs]
    for proc in procs:
        proc.join()
    totals = {key: sum(part[key] for part in parts) for key in ("ok", "refused", "errors")}
    latencies = sorted(latency for part in parts for latency in part["latencies"])
    totals["rate"] = totals["ok"] / args.seconds
    totals["cpu_ms"] = 1000 * cpu / max(1, totals["ok"] + totals["refused"])
    totals["load"] = load_average
    totals["p50_ms"] = 1000 * statistics.median(latencies) if latencies else float("nan")
    totals["p99_ms"] = 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    return totals


def run_once(app: str, clients, args, db_url: str, scratch: str) -> dict:
    server = Server(app, args, db_url, scratch)
    try:
        return load(server, clients, args)
    finally:
        server.stop()


def prime(clients) -> None:
    """Each node's first report, recorded in full as it is once after registration: the runs measure the steady
    state of a fleet the server knows."""
    from django.conf import settings

    from agent.protocol import Report
    from agents.credentials import agent_credential_authenticate
    from agents.reports import agent_report_record

    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 0}
    for credential, bodies in clients:
        found = agent_credential_authenticate(credential=credential)
        for body in bodies:
            agent_report_record(node=found.node, report=Report.from_dict(json.loads(body)))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds sent before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="Tessera and floor runs, interleaved; medians count")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-class", default="gthread", choices=["gthread", "sync"])
    parser.add_argument("--threads", type=int, default=2, help="gthread threads per worker (one per core)")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--mig-every", type=int, default=5, help="one node in N runs MIG (0: none)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 20 agents, 3 s, one round")
    args = parser.parse_args(argv)
    if args.quick:
        args.agents, args.seconds, args.warmup, args.rounds = 20, 3.0, 1.0, 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        connection, old_name = setup_django(scratch, "b2")
        try:
            from django.utils import timezone

            from fleet.models import Node

            started = time.perf_counter()
            clients = seed(args.agents, args.mig_every)
            share = inventory_change_share(clients)
            body_kib = statistics.mean(len(body) for _, bodies in clients for body in bodies) / 1024
            print(f"seeded {args.agents} agents in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            prime(clients)
            db_url = database_url(connection)
            connection.close()
            tessera, floor = [], []
            for _ in range(args.rounds):
                began = timezone.now()
                tessera.append(run_once("config.wsgi:application", clients, args, db_url, scratch))
                reported = Node.objects.filter(agent_last_seen_at__gte=began).count()
                assert reported == args.agents, f"only {reported} of {args.agents} nodes recorded a report"
                floor.append(run_once("bench.b2_agent_ingest:floor_app()", clients, args, db_url, scratch))
                connection.close()
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0)

    rate = statistics.median(r["rate"] for r in tessera)
    floor_rate = statistics.median(r["rate"] for r in floor)
    ratio = rate / floor_rate
    problems = sum(r["refused"] + r["errors"] for r in tessera + floor)
    ok = rate >= TARGET_RATE and ratio >= TARGET_SHARE and not problems
    print(
        f"B2 agent report ingest: {args.agents} agents × 8 GPUs ({body_kib:.1f} KiB reports, MIG on 1 node in "
        f"{args.mig_every or '∞'}), gunicorn {args.workers} gthread workers × {args.threads} threads, "
        f"{args.client_processes} client processes, {args.seconds:g} s × {args.rounds} round(s)"
    )
    print(f"  reports whose inventory changed since the agent's previous one: {100 * share:.1f} %")
    loads = ", ".join(f"{r['load']:.1f}" for r in tessera + floor)
    print(f"  1-minute load average at the end of each run (this benchmark alone keeps ~4 processes busy): {loads}")
    for name, runs in (("Tessera /api/v1/agent/report/", tessera), ("floor (bare view: json.loads, 204)", floor)):
        each = ", ".join(f"{r['rate']:,.0f}" for r in runs)
        last = runs[-1]
        print(
            f"  {name}: {statistics.median(r['rate'] for r in runs):,.0f} reports/s (runs: {each}; "
            f"server CPU {statistics.median(r['cpu_ms'] for r in runs):.2f} ms per report; "
            f"p50 {last['p50_ms']:.1f} ms, p99 {last['p99_ms']:.1f} ms; "
            f"non-2xx {sum(r['refused'] for r in runs)}, errors {sum(r['errors'] for r in runs)})"
        )
    print(f"  ratio Tessera/floor: {ratio:.2f}")
    print(
        f"  target ≥ {TARGET_RATE:,} reports/s: {verdict(rate >= TARGET_RATE)}; "
        f"target ≥ {TARGET_SHARE:.0%} of the floor: {verdict(ratio >= TARGET_SHARE)}"
        + ("" if not problems else f"; FAIL: {problems} requests refused or failed")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
