"""Real processes for integration tests: a Celery worker on a chosen broker, sharing the test database."""

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

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


def wait_until(predicate, *, timeout: float = 60, interval: float = 0.2, message: str = "condition"):
    """Poll until predicate() is truthy; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
