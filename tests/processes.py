"""Real processes for integration tests: a Celery worker on a chosen broker, a gunicorn web server sharing the test
database, and the node agent on simulated GPUs."""

import os
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

from django.db import connection

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
def celery_worker(var_dir: Path, broker_url: str, *, log_path: Path | None = None):
    """Run `celery worker` until the block ends; stop it warmly with TERM, as an operator would."""
    log = open(log_path or var_dir / "worker.log", "wb")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "celery", "-A", "config", "worker", "-l", "INFO", "--concurrency", "1",
           "--without-heartbeat", "--without-gossip", "--without-mingle", "-n", f"test-{os.getpid()}@%h"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(var_dir, broker_url), stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


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
def web_server(var_dir: Path, *, workers: int = 1, threads: int = 4, eager_tasks: bool = True, **extra_env):
    """Serve Tessera with gunicorn on a free local port until the block ends; yields the base URL.

    With `eager_tasks` the server runs the tasks it enqueues itself (no worker or broker needed).
    """
    port = free_port()
    log_path = var_dir / f"web-{port}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}",
           "--workers", str(workers), "--threads", str(threads), "--worker-class", "gthread",
           "--graceful-timeout", "5", "--log-level", "warning"]  # fmt: skip
    buffered = {"TESSERA_AGENT_REPORT_FLUSH_SECONDS": "0.2"}  # agent reports written as in production
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
        yield url
    finally:
        _stop(proc)
        log.close()


def wait_until(predicate, *, timeout: float = 60, interval: float = 0.2, message: str = "condition"):
    """Poll until predicate() is truthy; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


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
