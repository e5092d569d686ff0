"""`make run`'s command on its embedded default, as a new user starts it: SQLite and the filesystem broker in a
fresh var directory, the simulated fleet, and the lab of simulated agents joining their pool; Ctrl-C stops it all."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from contextlib import contextmanager

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


LAB_NODES_SEEN = "SELECT MIN(node.last_seen_at) FROM fleet_node AS node WHERE node.name LIKE 'sim-node-%'"


@contextmanager
def _make_run(var_dir, log_path, port):
    """`manage.py run_embedded` on the embedded default in `var_dir` until the block ends; then Ctrl-C, and it must
    stop cleanly."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings.local", TESSERA_VAR_DIR=str(var_dir))
    env.update(TESSERA_ADMIN_PASSWORD="a-long-test-password")
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
        output = lambda: log_path.read_text(errors="replace")  # noqa: E731
        try:
            wait_until(lambda: "Tessera is running" in output() or proc.poll() is not None, timeout=120)
            assert proc.poll() is None, output()
            assert f"Tessera is running at http://127.0.0.1:{port}/" in output()
            assert wait_until(lambda: _healthz(port), timeout=60, message="the web server to answer") == 200
            yield output
        finally:
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=60)
    assert code == 0 and "Stopped." in output() and "Traceback" not in output()


def test_the_embedded_default_starts_the_fleet_and_the_agent_lab_then_stops_on_ctrl_c(tmp_path):
    database, port = tmp_path / "tessera.sqlite3", free_port()
    with _make_run(tmp_path, tmp_path / "first.log", port) as output:
        assert "Login: admin / (from TESSERA_ADMIN_PASSWORD)" in output()
        assert "Agent lab: cluster demo-lab, 2 simulated agent nodes in pool lab-h100" in output()
        kubectl = "get nodes -L nvidia.com/gpu.product,nvidia.com/mig.config,nvidia.com/mig.config.state"
        assert kubectl in output()
        nodes = wait_until(
            lambda: len(_lab_nodes(database)) == 2 and _lab_nodes(database),
            timeout=60,
            message="both simulated agents to register and report",
        )
        assert nodes == [("sim-node-0", "lab-h100"), ("sim-node-1", "lab-h100")]
    assert {p.name for p in (tmp_path / "agents").iterdir()} == {"sim-node-0", "sim-node-1"}
    seen = _query(database, LAB_NODES_SEEN)
    # Started again, the agents report with their stored credentials: no new join token is made for them.
    with _make_run(tmp_path, tmp_path / "second.log", port):
        wait_until(lambda: _query(database, LAB_NODES_SEEN) > seen, timeout=60, message="both agents to report again")
    assert _query(database, "SELECT COUNT(*) FROM fleet_agentjointoken") == 1


def _children(var_dir) -> dict:
    try:
        return json.loads((var_dir / "run" / "children.json").read_text())["children"]
    except (OSError, ValueError):
        return {}


def test_every_part_killed_comes_back_and_the_stack_keeps_serving(tmp_path):
    """SIGKILL each child of run_embedded in turn: the supervisor restarts it (new pid, one more restart), the web
    server answers again, and Ctrl-C still stops everything with status 0."""
    port = free_port()
    with _make_run(tmp_path, tmp_path / "run.log", port) as output:
        parts = ["web", "worker", "beat", "watcher", "simulator", "agents"]
        assert set(_children(tmp_path)) == set(parts)
        for name in parts:
            before = _children(tmp_path)[name]
            os.kill(before["pid"], signal.SIGKILL)
            after = wait_until(
                lambda n=name, b=before: (
                    (c := _children(tmp_path)[n])["restarts"] == b["restarts"] + 1
                    and c["state"] == "running"
                    and c["pid"] not in (None, b["pid"])
                    and c
                ),
                timeout=90,
                message=f"{name} to be restarted",
            )
            assert after["last_exit"] == -signal.SIGKILL
            assert f"{name} exited with signal SIGKILL; restarting in" in output()
        assert wait_until(lambda: _healthz(port), timeout=60, message="the web server to answer again") == 200


def _query(database, sql: str):
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchone()[0]


def _healthz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            return reply.status
    except OSError:
        return None
