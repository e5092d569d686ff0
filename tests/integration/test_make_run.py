"""`make run`'s command on its embedded default, as a new user starts it: SQLite and the filesystem broker in a
fresh var directory, the simulated fleet, and the lab of simulated agents joining their pool; Ctrl-C stops it all."""

import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request

from tests.processes import ROOT, free_port, wait_until

LAB_NODES = """
    SELECT node.name, pool.name FROM fleet_node AS node
    JOIN fleet_cluster AS cluster ON cluster.id = node.cluster_id
    LEFT JOIN fleet_nodepool AS pool ON pool.id = node.pool_id
    WHERE cluster.name = 'demo-lab' AND node.last_seen_at IS NOT NULL
"""


def _lab_nodes(database) -> list[tuple[str, str]]:
    if not database.exists():
        return []
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        try:
            return sorted(db.execute(LAB_NODES).fetchall())
        except sqlite3.OperationalError:  # not migrated yet
            return []


def test_the_embedded_default_starts_the_fleet_and_the_agent_lab_then_stops_on_ctrl_c(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings.local", TESSERA_VAR_DIR=str(tmp_path))
    env.update(TESSERA_ADMIN_PASSWORD="a-long-test-password")
    log_path = tmp_path / "run.log"
    command = [
        sys.executable,
        "manage.py",
        "run_embedded",
        "--port",
        str(port),
        "--sim-nodes",
        "2",
        "--sim-agents",
        "2",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            output = lambda: log_path.read_text(errors="replace")  # noqa: E731
            wait_until(lambda: "Tessera is running" in output() or proc.poll() is not None, timeout=120)
            assert proc.poll() is None, output()
            assert f"Tessera is running at http://127.0.0.1:{port}/" in output()
            assert "Login: admin / (from TESSERA_ADMIN_PASSWORD)" in output()
            assert "Agent lab: cluster demo-lab, 2 simulated agent nodes in pool lab-h100" in output()
            ready = wait_until(lambda: _healthz(port), timeout=60, message="the web server to answer")
            assert ready == 200
            nodes = wait_until(
                lambda: len(_lab_nodes(tmp_path / "tessera.sqlite3")) == 2 and _lab_nodes(tmp_path / "tessera.sqlite3"),
                timeout=60,
                message="both simulated agents to register and report",
            )
            assert nodes == [("sim-node-0", "lab-h100"), ("sim-node-1", "lab-h100")]
            assert "Traceback" not in output()
        finally:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
    assert code == 0 and "Stopped." in log_path.read_text(errors="replace")
    assert {p.name for p in (tmp_path / "agents").iterdir()} == {"sim-node-0", "sim-node-1"}


def _healthz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            return reply.status
    except OSError:
        return None
