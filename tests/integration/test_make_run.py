"""`make run`'s command on its embedded default, as a new user starts it: SQLite and the filesystem broker in a
fresh var directory, the simulated fleet, and the lab of simulated agents joining their pool; Ctrl-C stops it all."""

import json
import os
import signal
import sqlite3

from tests.processes import free_port, healthz, make_run, wait_until

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


def _make_run(var_dir, log_path, port):
    return make_run(var_dir, log_path, port, "--sim-nodes", "2", "--sim-agents", "2")


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
        assert wait_until(lambda: healthz(port), timeout=60, message="the web server to answer again") == 200


def _query(database, sql: str):
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchone()[0]
