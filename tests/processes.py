"""Real processes for integration tests: a Celery worker on a chosen broker, a gunicorn web server sharing the test
database, the node agent on simulated GPUs, and the simulator on a state directory."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from django.db import connection
from kubernetes import client, config

from simulator.persist import STATE_FILE

ROOT = Path(__file__).resolve().parents[1]


def database_url() -> str:
    """The URL of the database this test runs on (the test database), for child processes."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def child_env(var_dir: Path, broker_url: str, **extra) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "TESSERA_TEST_EAGER": "false",
        "TESSERA_VAR_DIR": str(var_dir),
        "DATABASE_URL": database_url(),
        "CELERY_BROKER_URL": broker_url,
        **extra,
    }


@contextmanager
def celery_worker(
    var_dir: Path, broker_url: str, *, log_path: Path | None = None, name: str = f"test-{os.getpid()}", **extra_env
):
    """Run `celery worker` until the block ends; stop it warmly with TERM, as an operator would. `extra_env`
    overrides child_env's (e.g. another DATABASE_URL)."""
    cmd = [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "INFO", "--concurrency", "1",
           "--without-heartbeat", "--without-gossip", "--without-mingle", "-n", f"{name}@%h"]  # fmt: skip
    with _child(cmd, log_path or var_dir / "worker.log", child_env(var_dir, broker_url, **extra_env)) as proc:
        yield proc


@contextmanager
def celery_beat(var_dir: Path, broker_url: str, *, log_path: Path, **extra_env):
    """Run `celery beat` (Tessera's scheduler, core.beat) until the block ends."""
    cmd = [sys.executable, "-m", "celery", "-A", "config", "beat", "-l", "INFO"]
    with _child(cmd, log_path, child_env(var_dir, broker_url, **extra_env)) as proc:
        yield proc


@contextmanager
def _child(cmd: list[str], log_path: Path, env: dict):
    """A child process logging to `log_path`; TERM when the block ends (KILL after 20 s)."""
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        _stop(proc)
        log.close()


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its children (a prefork pool, gunicorn's workers), as an OOM killer or a node loss
    would."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    for target in [pid, *children]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def web_server(var_dir: Path, **options):
    """Serve Tessera with gunicorn on a free local port until the block ends; yields the base URL (options: those of
    `web_server_process`)."""
    with web_server_process(var_dir, **options) as (url, _):
        yield url


@contextmanager
def web_server_process(var_dir: Path, *, workers: int = 1, threads: int = 4, eager_tasks: bool = True, **extra_env):
    """Serve Tessera with gunicorn on a free local port until the block ends; yields (base URL, gunicorn's master).

    With `eager_tasks` the server runs the tasks it enqueues itself (no worker or broker needed).
    """
    port = free_port()
    log_path = var_dir / f"web-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}",
           "--workers", str(workers), "--threads", str(threads), "--worker-class", "gthread",
           "--graceful-timeout", "5", "--log-level", "warning"]  # fmt: skip
    # agent reports buffered and credential rows cached as in production
    buffered = {"TESSERA_AGENT_REPORT_FLUSH_SECONDS": "0.2", "TESSERA_AGENT_REPORT_CACHE_SECONDS": "900"}
    env = child_env(var_dir, "memory://", TESSERA_TEST_EAGER=str(eager_tasks).lower(), **{**buffered, **extra_env})
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the web server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the web server did not answer: {log_path.read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield url, proc
    finally:
        _stop(proc)
        log.close()


class SimulatorProcess:
    """`python -m simulator` on a fixed port and state directory, as `make run` starts it, until `stop()` (with the
    signal given: a restart test kills it too); its stderr goes to a file the test reads."""

    def __init__(self, state_dir: Path, port: int, *extra: str, nodes: int = 12, seed: int = 7):
        self.state_dir, self.url = state_dir, f"https://127.0.0.1:{port}"
        self.kubeconfig = state_dir / "kubeconfig"
        self.stderr_path = state_dir / f"stderr-{time.monotonic_ns()}.log"
        cmd = [sys.executable, "-m", "simulator", "--port", str(port), "--nodes", str(nodes), "--seed", str(seed),
               "--state-dir", str(state_dir), "--write-kubeconfig", str(self.kubeconfig), *extra]  # fmt: skip
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
        line = self.proc.stdout.readline()
        assert re.search(r"serving https://127\.0\.0\.1:\d+ ", line), (line, self.stderr())

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.proc.send_signal(signum)
        code = self.proc.wait(timeout=20)
        self.proc.stdout.close()
        return code

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(config.new_client_from_config(config_file=str(self.kubeconfig)))

    def wait_saved(self, resource_version: int) -> None:
        """Until the state file holds the cluster at `resource_version` or later (written a second after a change)."""

        def saved() -> bool:
            try:
                document = json.loads((self.state_dir / STATE_FILE).read_bytes())
            except FileNotFoundError:
                return False
            return document["resource_version"] >= resource_version

        wait_until(saved, timeout=20, message=f"the state file at resourceVersion {resource_version}")


def wait_until(predicate, *, timeout: float = 60, interval: float = 0.2, message: str = "condition"):
    """Poll until predicate() is truthy; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


@contextmanager
def make_run(var_dir: Path, log_path: Path, port: int, *options: str):
    """`manage.py run_embedded` (`make run`'s command) on the embedded default in `var_dir`, with `options`, until the
    block ends; yields a function returning its terminal output so far. Then Ctrl-C, and it must stop cleanly."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings.local", TESSERA_VAR_DIR=str(var_dir))
    env.update(TESSERA_ADMIN_PASSWORD=MAKE_RUN_PASSWORD)
    command = [sys.executable, "manage.py", "run_embedded", "--port", str(port), *options]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        output = lambda: log_path.read_text(errors="replace")  # noqa: E731
        try:
            wait_until(lambda: "Tessera is running" in output() or proc.poll() is not None, timeout=120)
            assert proc.poll() is None, output()
            assert f"Tessera is running at http://127.0.0.1:{port}/" in output()
            assert wait_until(lambda: healthz(port), timeout=60, message="the web server to answer") == 200
            yield output
        finally:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
    assert code == 0 and "Stopped." in output() and "Traceback" not in output()


MAKE_RUN_PASSWORD = "a-long-test-password"


def healthz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            return reply.status
    except OSError:
        return None


def simulated_agent(
    url: str, state_dir: Path, var_dir: Path, *extra: str, seed: int, join_token: str = "", name: str = "agent"
) -> tuple[subprocess.Popen, IO[bytes]]:
    """Start `python -m agent --simulate` (2 idle H100s, one report a second) against `url`; the join token goes by
    environment, the output to `<var_dir>/<name>.log`. Returns (process, log file) for `finish`."""
    log = open(var_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed by finish
    cmd = [sys.executable, "-m", "agent", "--server", url, "--simulate", "--seed", str(seed), "--gpus", "2",
           "--no-workload", "--interval", "1", "--state-dir", str(state_dir), "--insecure-lab", *extra]  # fmt: skip
    env = child_env(var_dir, "memory://", TESSERA_JOIN_TOKEN=join_token)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log


def finish(proc: subprocess.Popen, log: IO[bytes], *, timeout: float = 20) -> int:
    """Wait for the process to exit (killed after `timeout` seconds) and close its log; returns its exit code."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def required_binary(name: str, package: str) -> str:
    """The path of an installed tool the test needs; skipped where it is missing, but failed under CI=true (where
    `make test` installs Debian's `package`: such tests may not skip there)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: run `make {package}` (as root) or `apt-get install {package}`"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; it is required in CI")
        pytest.skip(message)
    return path


@contextmanager
def manage_py(var_dir: Path, *args: str, name: str = "manage"):
    """Run `manage.py <args>` (e.g. watch_clusters) on the test database until the block ends; output to
    `<var_dir>/<name>.log`."""
    log = open(var_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed below
    env = child_env(var_dir, "memory://")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        yield proc
    finally:
        _stop(proc)
        log.close()


@contextmanager
def prometheus_server(
    work_dir: Path, *, targets: list[str], rule_files: list[Path], interval: str = "1s", bearer_token: str = ""
):
    """Debian's Prometheus on a free loopback port scraping `targets` (host:port, path /metrics, with
    `Authorization: Bearer` when a token is given) and evaluating `rule_files` every `interval`, its data in
    `work_dir`; yields its base URL once it is ready."""
    binary = required_binary("prometheus", "prometheus")
    port = free_port()
    config = work_dir / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: {interval}\n"
        f"rule_files: [{', '.join(str(p) for p in rule_files)}]\n"
        "scrape_configs:\n"
        f"  - job_name: tessera\n    static_configs: [{{targets: [{', '.join(targets)}]}}]\n"
        + (f"    authorization: {{credentials: {bearer_token}}}\n" if bearer_token else "")
    )
    log_path = work_dir / "prometheus.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    cmd = [binary, f"--config.file={config}", f"--storage.tsdb.path={work_dir / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=work_dir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready():
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    try:
        wait_until(ready, timeout=30, message="prometheus to be ready")
        yield url
    finally:
        _stop(proc)
        log.close()
