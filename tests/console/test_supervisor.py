"""The supervisor of `make run` with real processes: a part that exits comes back after a growing back-off, one that
keeps failing stops the stack with a non-zero status (or is only reported when not essential), and stopping leaves
no process behind, grandchildren included."""

import json
import os
import signal
import sys
import time

import pytest

from console import supervisor as sup
from console.supervisor import ChildSpec, Supervisor, backoff_seconds

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
FAILS = [sys.executable, "-c", "import sys; sys.exit(3)"]


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(sup, "BACKOFF_START", 0.05)
    monkeypatch.setattr(sup, "BACKOFF_CAP", 0.2)
    monkeypatch.setattr(sup, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(sup, "STOP_TIMEOUT", 3)


def _wait(predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_back_off_doubles_up_to_its_cap():
    assert [backoff_seconds(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert backoff_seconds(30) == sup.BACKOFF_CAP


def test_a_killed_child_is_restarted_and_the_status_file_says_so(tmp_path, fast):
    lines = []
    status = tmp_path / "children.json"
    s = Supervisor([ChildSpec("web", SLEEPER)], status_path=status, log=lines.append)
    s.start_all()
    first = s.children["web"].proc.pid
    os.kill(first, signal.SIGKILL)
    _wait(lambda: (s._tick(time.monotonic()), s.children["web"].restarts)[1])  # run()'s loop, a tick at a time
    child = s.children["web"]
    assert child.restarts == 1 and child.proc.pid != first and child.state == "running"
    data = json.loads(status.read_text())["children"]["web"]
    assert data["restarts"] == 1 and data["last_exit"] == -signal.SIGKILL and data["pid"] == child.proc.pid
    assert any("web exited with signal SIGKILL; restarting in" in line for line in lines)
    s.stop_all()
    assert not _alive(child.proc.pid)


def test_an_essential_child_that_keeps_failing_stops_the_stack_with_status_1(tmp_path, fast):
    lines = []
    s = Supervisor(
        [ChildSpec("worker", FAILS), ChildSpec("web", SLEEPER)], status_path=tmp_path / "c.json", log=lines.append
    )
    s.start_all()
    web = s.children["web"].proc.pid
    assert s.run() == 1
    assert s.failed == ["worker"] and s.children["worker"].restarts == sup.GIVE_UP_AFTER - 1
    assert any("worker exited 5 times" in line and "Tessera stops" in line for line in lines)
    assert not _alive(web)  # the others stopped with it


def test_a_non_essential_child_that_keeps_failing_is_reported_and_the_rest_runs_on(tmp_path, fast):
    lines = []
    s = Supervisor(
        [ChildSpec("agents", FAILS, essential=False), ChildSpec("web", SLEEPER)],
        status_path=tmp_path / "c.json",
        log=lines.append,
    )
    s.start_all()
    _wait(lambda: (s._tick(time.monotonic()), s.children["agents"].state == "given_up")[1])
    assert not s.failed and s.children["web"].state == "running"
    assert json.loads((tmp_path / "c.json").read_text())["children"]["agents"]["state"] == "given_up"
    assert any("the rest keeps running" in line for line in lines)
    s.stop_all()


def test_stopping_leaves_no_grandchild_behind(tmp_path, fast):
    pid_file = tmp_path / "grandchild.pid"
    spawns = [
        sys.executable,
        "-c",
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); open({str(pid_file)!r}, 'w')"
        ".write(str(p.pid)); signal = __import__('signal'); signal.signal(signal.SIGTERM, lambda *a: sys.exit(0));"
        " time.sleep(600)",
    ]
    s = Supervisor([ChildSpec("gunicorn-like", spawns)], status_path=tmp_path / "c.json", log=lambda _: None)
    s.start_all()
    _wait(lambda: pid_file.exists() and pid_file.read_text())
    grandchild = int(pid_file.read_text())
    assert _alive(grandchild)
    s.stop_all()
    _wait(lambda: not _alive(grandchild), timeout=10)


def test_chores_run_at_their_period_and_one_failing_is_logged_not_fatal(tmp_path):
    lines, runs = [], []

    def failing():
        raise RuntimeError("database is locked")

    chores = [sup.Chore("Counting", 10, lambda: runs.append(1)), sup.Chore("Extending the demo schedule", 10, failing)]
    s = Supervisor([], status_path=tmp_path / "children.json", log=lines.append, chores=chores)
    for now in (100.0, 105.0, 110.0, 119.0, 120.5):
        s._do_chores(now)
    assert len(runs) == 3  # at 100, 110 and 120.5
    assert lines == ["Extending the demo schedule failed: database is locked"] * 3
