"""The process supervisor of `make run`: start every part, restart a part that exits, stop them all together.

A child that exits is started again after a back-off that doubles from `BACKOFF_START` up to `BACKOFF_CAP`; each
restart is logged with the exit status and written to a status file that `/readyz` and the overview read. A child
that fails `GIVE_UP_AFTER` times within `FAILURE_WINDOW` seconds is reported loudly and not restarted again; when it is
an essential part of Tessera the whole stack stops and `run()` returns non-zero, so whatever started `make run` sees
it. Only SIGINT/SIGTERM stop a healthy stack: each child is sent TERM (KILL after `STOP_TIMEOUT`), then its whole
process group KILL, so gunicorn's and Celery's own workers, the simulator and the agents leave no orphan behind.

Why our own and not honcho or supervisord: honcho stops everything when one process exits (the very behaviour this
replaces) and supervisord is a daemon with its own config and RPC; what `make run` needs is a hundred lines that
restart with back-off, re-register the simulator after it restarts, and publish their state to Tessera.
"""

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BACKOFF_START = 1.0
BACKOFF_CAP = 60.0
GIVE_UP_AFTER = 5
FAILURE_WINDOW = 600.0
STOP_TIMEOUT = 15.0
POLL_SECONDS = 0.5


@dataclass
class ChildSpec:
    """One part of the stack. `before_start` and `after_start` run around every (re)start, e.g. to wait for the
    simulator and register it again; `essential` parts stop the stack when they keep failing, others (the simulator,
    the agent lab: the demo around Tessera) are only reported."""

    name: str
    cmd: list[str]
    env: dict[str, str] | None = None
    essential: bool = True
    before_start: Callable[[], None] | None = None
    after_start: Callable[[subprocess.Popen], None] | None = None
    stop_last: bool = False


@dataclass
class Chore:
    """Work the supervisor does itself every `every` seconds while the stack runs (e.g. extend the demo schedule);
    an exception is logged and the chore tried again at its next turn."""

    name: str
    every: float
    run: Callable[[], None]
    due_at: float = 0.0


@dataclass
class _Child:
    spec: ChildSpec
    proc: subprocess.Popen | None = None
    state: str = "starting"  # running, restarting, given_up, stopped
    restarts: int = 0
    started_at: float = 0.0
    restart_at: float = 0.0
    last_exit: int | None = None
    last_exit_at: float | None = None
    failures: list[float] = field(default_factory=list)

    def status(self) -> dict:
        return {
            "pid": self.proc.pid if self.proc and self.proc.poll() is None else None,
            "state": self.state,
            "essential": self.spec.essential,
            "restarts": self.restarts,
            "started_at": self.started_at or None,
            "last_exit": self.last_exit,
            "last_exit_at": self.last_exit_at,
            "next_start_at": self.restart_at if self.state == "restarting" else None,
        }


def backoff_seconds(recent_failures: int) -> float:
    """1 s after the first failure, doubling with each failure in the window, at most BACKOFF_CAP."""
    return min(BACKOFF_CAP, BACKOFF_START * 2 ** max(0, recent_failures - 1))


class Supervisor:
    def __init__(
        self, specs: list[ChildSpec], *, status_path: Path, log: Callable[[str], None], chores: list[Chore] = ()
    ):
        self.children = {spec.name: _Child(spec) for spec in specs}
        self.chores = list(chores)
        self.status_path = status_path
        self.log = log
        self._stopping = False
        self.failed: list[str] = []

    # --- life cycle ---------------------------------------------------------------------------------------------

    def start_all(self) -> None:
        """Start every child in order; a failing `after_start` (the simulator not answering) raises."""
        for child in self.children.values():
            self._start(child)
        self._write_status()

    def run(self) -> int:
        """Supervise until SIGINT/SIGTERM (returns 0) or until an essential child keeps failing (returns 1)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self._stopping and not self.failed:
                self._tick(time.monotonic())
                self._do_chores(time.monotonic())
                time.sleep(POLL_SECONDS)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop_all()
        return 1 if self.failed else 0

    def stop_all(self) -> None:
        """TERM every child, then KILL its process group (what it left behind); `stop_last` children (the simulator) go
        last, so the watcher and the worker never see their cluster vanish while they shut down."""
        self.log("Stopping…")
        children = list(self.children.values())
        for group in ([c for c in children if not c.spec.stop_last], [c for c in children if c.spec.stop_last]):
            live = [c for c in group if c.proc is not None and c.proc.poll() is None]
            # The leader only: gunicorn and Celery stop their own workers (TERMed behind its back, Celery logs each
            # as an error); the KILL of the group below takes whatever a leader leaves.
            for child in live:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT
            for child in live:
                try:
                    child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    _signal_group(child.proc, signal.SIGKILL)
                    child.proc.wait()
            for child in group:
                if child.proc is not None:
                    _signal_group(child.proc, signal.SIGKILL)  # grandchildren a TERMed leader left behind
                if child.state != "given_up":
                    child.state = "stopped"
        self._write_status()

    # --- internals ----------------------------------------------------------------------------------------------

    def _on_signal(self, *_args) -> None:
        self._stopping = True

    def _start(self, child: _Child) -> None:
        if child.spec.before_start is not None:
            child.spec.before_start()
        child.proc = subprocess.Popen(child.spec.cmd, env=child.spec.env, start_new_session=True)
        child.started_at = time.time()
        if child.spec.after_start is not None:
            child.spec.after_start(child.proc)
        child.state = "running"

    def _tick(self, now: float) -> None:
        changed = False
        for child in self.children.values():
            if child.state == "running" and child.proc.poll() is not None:
                self._exited(child, now)
                changed = True
            elif child.state == "restarting" and now >= child.restart_at:
                child.restarts += 1
                self.log(f"Restarting {child.spec.name} (restart {child.restarts}).")
                try:
                    self._start(child)
                except Exception as exc:  # noqa: BLE001 - a failed start is one more failure, never the supervisor's end
                    self.log(f"{child.spec.name} did not come back: {exc}")
                    if child.proc is not None and child.proc.poll() is None:
                        _signal_group(child.proc, signal.SIGKILL)
                        child.proc.wait()
                    self._exited(child, time.monotonic())
                changed = True
        if changed:
            self._write_status()

    def _do_chores(self, now: float) -> None:
        for chore in self.chores:
            if now < chore.due_at:
                continue
            chore.due_at = now + chore.every
            try:
                chore.run()
            except Exception as exc:  # noqa: BLE001 - a chore failing never stops the stack
                self.log(f"{chore.name} failed: {exc}")

    def _exited(self, child: _Child, now: float) -> None:
        status = child.proc.returncode
        child.last_exit, child.last_exit_at = status, time.time()
        _signal_group(child.proc, signal.SIGKILL)  # what the dead leader left running
        child.failures = [t for t in child.failures if now - t < FAILURE_WINDOW] + [now]
        if len(child.failures) >= GIVE_UP_AFTER:
            child.state = "given_up"
            what = "Tessera stops" if child.spec.essential else "the rest keeps running"
            self.log(
                f"!!! {child.spec.name} exited {len(child.failures)} times within {FAILURE_WINDOW:.0f} s "
                f"(last status {_describe(status)}); not restarting it again: {what}."
            )
            if child.spec.essential:
                self.failed.append(child.spec.name)
            return
        delay = backoff_seconds(len(child.failures))
        child.state, child.restart_at = "restarting", now + delay
        self.log(f"{child.spec.name} exited with {_describe(status)}; restarting in {delay:.0f} s.")

    def _write_status(self) -> None:
        status = {
            "supervisor_pid": os.getpid(),
            "updated_at": time.time(),
            "children": {name: child.status() for name, child in self.children.items()},
        }
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        part = self.status_path.with_suffix(".part")
        part.write_text(json.dumps(status, indent=1))
        os.replace(part, self.status_path)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _describe(status: int | None) -> str:
    if status is not None and status < 0:
        return f"signal {signal.Signals(-status).name}"
    return f"status {status}"
