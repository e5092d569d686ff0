"""Soak: `make run`'s embedded stack left running with rollouts every few minutes and its parts killed on the way.

Starts `manage.py run_embedded` on a fresh var directory (SQLite, the embedded broker, the simulated fleet, the agent
lab), makes a pool of the simulator's H100 nodes and flips its default profile between MIG 1g.10gb ×7 and whole GPUs
every `--rollout-every` minutes (each flip is a rollout with GPU resets). Every minute it samples: the children and
their restarts (the supervisor's status file), `/healthz` and an API page's latency, the RSS of every process of each
part (its process group), the size of `var/` by part, and whether the last flip has arrived on every node. Along the
way it SIGKILLs the worker, beat and web once each and times their return. At the end: a table per minute, growth
per hour of each part, and PASS/FAIL against the targets (no stack stop, every killed part back within 30 s, no
desired state that never arrived).

    .venv/bin/python -m bench.soak --minutes 60
    .venv/bin/python -m bench.soak --quick          # 4 minutes, one flip, the three kills: a smoke test
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
H100 = "NVIDIA-H100-80GB-HBM3"
KILLED = ("worker", "beat", "web")
BACK_WITHIN = 30.0
ARRIVE_WITHIN = 600.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, base: str, token: str = ""):
        self.base, self.token = base, token

    def call(self, method: str, path: str, body=None, timeout=30):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Token {self.token}")
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            text = reply.read()
            return reply.status, (json.loads(text) if text else None)

    def timed(self, path: str) -> float | None:
        start = time.perf_counter()
        try:
            self.call("GET", path, timeout=10)
        except (OSError, urllib.error.HTTPError):
            return None
        return (time.perf_counter() - start) * 1000


def _rss_mib(pgid: int) -> float:
    """Resident memory of every process in the group (the part and its own workers), in MiB."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ProcessLookupError):
            continue
    return total / 1024


def _size_mib(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20 if path.exists() else 0.0


def _var_parts(var: Path) -> dict[str, float]:
    return {
        "db": _size_mib(var / "tessera.sqlite3"),
        "wal": _size_mib(var / "tessera.sqlite3-wal"),
        "broker": _size_mib(var / "celery"),
        "sim": _size_mib(var / "sim"),
        "agents": _size_mib(var / "agents"),
        "other": _size_mib(var)
        - sum(_size_mib(var / n) for n in ("tessera.sqlite3", "tessera.sqlite3-wal", "celery", "sim", "agents")),
    }


class Stack:
    """`manage.py run_embedded` in its own var directory, its output in `log`."""

    def __init__(self, var: Path, port: int, nodes: int, agents: int):
        self.var, self.port = var, port
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
        self.env = {**env, "DJANGO_SETTINGS_MODULE": "config.settings.local", "TESSERA_VAR_DIR": str(var)}
        self.env["TESSERA_ADMIN_PASSWORD"] = "soak-" + os.urandom(8).hex()
        # The simulator's workloads keep GPUs busy: its rollouts cordon and drain rather than wait half an hour.
        self.env["TESSERA_ROLLOUT_BUSY_POLICY"] = "drain"
        self.log_path = var.parent / "run.log"
        cmd = [sys.executable, "manage.py", "run_embedded", "--port", str(port), "--sim-nodes", str(nodes)]
        self.proc = subprocess.Popen(
            [*cmd, "--sim-agents", str(agents)],
            cwd=ROOT,
            env=self.env,
            stdout=open(self.log_path, "wb"),  # noqa: SIM115 - lives as long as the stack
            stderr=subprocess.STDOUT,
        )

    def children(self) -> dict:
        try:
            return json.loads((self.var / "run" / "children.json").read_text())["children"]
        except (OSError, ValueError):
            return {}

    def token(self) -> str:
        out = subprocess.run(
            [sys.executable, "manage.py", "api_token", "admin"], cwd=ROOT, env=self.env, capture_output=True
        )
        return out.stdout.decode().strip()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=120)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise SystemExit(f"soak: timed out waiting for {what}")


def _setup(api: Api) -> tuple[int, list[int]]:
    """A pool of the simulator's H100 nodes and the two profiles the flips alternate between."""
    _, clusters = api.call("GET", "/api/v1/clusters/?q=demo-sim")
    cluster = next(c["id"] for c in clusters["results"] if c["name"] == "demo-sim")
    _, pool = api.call(
        "POST",
        "/api/v1/node-pools/",
        {"name": "soak-h100", "cluster": cluster, "node_selector": f"nvidia.com/gpu.product={H100}"},
    )
    profiles = []
    for body in (
        {"name": "soak-mig", "mode": "mig", "target_products": [H100], "mig_layouts": {"all": {"1g.10gb": 7}}},
        {"name": "soak-whole", "mode": "passthrough", "target_products": [H100]},
    ):
        profiles.append(api.call("POST", "/api/v1/profiles/", body)[1]["id"])
    return pool["id"], profiles


def _in_sync(api: Api, pool: int) -> bool | None:
    try:
        _, page = api.call("GET", f"/api/v1/desired-states/?pool={pool}&page_size=1000")
    except (OSError, urllib.error.HTTPError):
        return None
    rows = page["results"]
    return bool(rows) and all(r["in_sync"] is True for r in rows)


def soak(minutes: float, rollout_every: float, nodes: int, agents: int) -> int:
    var = Path(tempfile.mkdtemp(prefix="tessera-soak-")) / "var"
    port = _free_port()
    stack = Stack(var, port, nodes, agents)
    base = f"http://127.0.0.1:{port}"
    api = Api(base)
    _wait(lambda: api.timed("/healthz") is not None, 240, "the stack to answer")
    api.token = stack.token()
    pool, profiles = _setup(api)
    started = time.monotonic()
    end = started + minutes * 60
    kill_at = {name: started + (i + 1) * minutes * 60 / (len(KILLED) + 1) for i, name in enumerate(KILLED)}
    flips, samples, kills, lost = 0, [], {}, []
    next_flip, next_sample = started, started
    pending_flip: tuple[int, float] | None = None
    print(f"soak: {minutes:g} min on {base}, var {var}, log {stack.log_path}", flush=True)
    print(f"{'min':>4} {'alive':>5} {'restarts':>8} {'healthz':>8} {'api':>7} {'sync':>5} "
          f"{'web':>6} {'worker':>6} {'beat':>6} {'watch':>6} {'sim':>6} {'agents':>6} "
          f"{'db':>6} {'wal':>6} {'broker':>6} {'var':>6}  (ms, RSS MiB, MiB)", flush=True)  # fmt: skip
    while time.monotonic() < end and stack.proc.poll() is None:
        now = time.monotonic()
        if now >= next_flip and pending_flip is None:
            flips += 1
            api.call("POST", f"/api/v1/profiles/{profiles[flips % 2]}/assign/", {"pool": pool})
            pending_flip, next_flip = (flips, now), now + rollout_every * 60
        if pending_flip and _in_sync(api, pool):
            pending_flip = None
        elif pending_flip and now - pending_flip[1] > ARRIVE_WITHIN:
            lost.append(pending_flip[0])
            pending_flip = None
        for name, at in kill_at.items():
            if name not in kills and now >= at:
                before = stack.children()[name]
                os.kill(before["pid"], signal.SIGKILL)
                killed = time.monotonic()
                _wait(lambda n=name, b=before: (stack.children()[n]["pid"] or b["pid"]) != b["pid"], 120, f"{name}")
                kills[name] = time.monotonic() - killed
        if now >= next_sample:
            samples.append(_sample(stack, api, pool, (now - started) / 60))
            next_sample += 60
        time.sleep(1)
    stopped_by_itself = stack.proc.poll() is not None
    code = stack.stop() if not stopped_by_itself else stack.proc.returncode
    return _report(samples, kills, lost, flips, stopped_by_itself, code)


def _sample(stack: Stack, api: Api, pool: int, minute: float) -> dict:
    children = stack.children()
    rss = {name: _rss_mib(c["pid"]) if c.get("pid") else 0.0 for name, c in children.items()}
    sample = {
        "minute": minute,
        "alive": sum(1 for c in children.values() if c["state"] == "running"),
        "restarts": sum(c["restarts"] for c in children.values()),
        "healthz": api.timed("/healthz"),
        "api": api.timed("/api/v1/nodes/?page_size=50"),
        "sync": _in_sync(api, pool),
        "rss": rss,
        "pids": {name: c.get("pid") for name, c in children.items()},
        "var": {**_var_parts(stack.var), "total": _size_mib(stack.var)},
    }
    r, v = rss, sample["var"]
    ms = lambda x: f"{x:8.1f}" if x is not None else "    down"  # noqa: E731
    print(f"{minute:4.0f} {sample['alive']:5d} {sample['restarts']:8d} {ms(sample['healthz'])} {ms(sample['api'])[1:]}"
          f" {str(sample['sync'])[:5]:>5} {r.get('web', 0):6.0f} {r.get('worker', 0):6.0f} {r.get('beat', 0):6.0f}"
          f" {r.get('watcher', 0):6.0f} {r.get('simulator', 0):6.0f} {r.get('agents', 0):6.0f} {v['db']:6.1f}"
          f" {v['wal']:6.1f} {v['broker']:6.2f} {v['total']:6.1f}", flush=True)  # fmt: skip
    return sample


def _slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares growth per hour of (minute, value) points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 60 * sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0


def _report(samples, kills, lost, flips, stopped_by_itself, code) -> int:
    settled = samples[len(samples) // 5 :] or samples  # after the first fifth: start-up caches filled
    print("\ngrowth per hour after the first fifth (least squares):")
    for name in ("web", "worker", "beat", "watcher", "simulator", "agents"):
        # Over the samples of the part's last process (a killed part starts small again).
        last_pid = samples[-1]["pids"].get(name) if samples else None
        points = [(s["minute"], s["rss"].get(name, 0.0)) for s in settled if s["pids"].get(name) == last_pid]
        span = f"{points[0][0]:.0f}–{points[-1][0]:.0f} min, last {points[-1][1]:.0f} MiB" if points else "no samples"
        print(f"  RSS {name:<10} {_slope_per_hour(points):+7.1f} MiB/h  ({span})")
    for part in ("db", "wal", "broker", "sim", "agents", "other", "total"):
        points = [(s["minute"], s["var"][part]) for s in settled]
        print(f"  var/{part:<9} {_slope_per_hour(points):+7.2f} MiB/h")
    print(f"\nflips (rollouts) started: {flips}; never arrived: {lost or 'none'}")
    for name in KILLED:
        print(f"  {name} killed: back in {kills[name]:.1f} s" if name in kills else f"  {name}: not killed")
    checks = {
        "the stack never stopped by itself": not stopped_by_itself,
        f"every killed part back within {BACK_WITHIN:.0f} s": all(kills.get(n, 1e9) <= BACK_WITHIN for n in KILLED),
        "every desired state arrived": not lost,
        "Ctrl-C stopped it with status 0": code == 0,
    }
    for what, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(checks.values()) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rollout-every", type=float, default=5, help="minutes between profile flips")
    parser.add_argument("--nodes", type=int, default=20, help="simulated Kubernetes nodes")
    parser.add_argument("--agents", type=int, default=4, help="simulated agent nodes")
    parser.add_argument("--quick", action="store_true", help="4 minutes, a flip every 2: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.rollout_every = 4, 2
    sys.exit(soak(args.minutes, args.rollout_every, args.nodes, args.agents))


if __name__ == "__main__":
    main()
