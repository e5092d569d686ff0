"""The simulated cluster on disk: what an admin or Tessera changed survives a restart of `python -m simulator`.

`<state dir>/cluster-state.json` holds every stored object (nodes with their labels, taints and status, pods,
ConfigMaps, the ClusterPolicy, admission objects, Events), the resourceVersion counter, and what the simulated
hardware and GPU Operator hold in memory (MIG layouts, why an apply failed, the config each device plugin runs).
It is replaced atomically (temp file, fsync, rename), so a reader sees the previous state or the next, never half.

A clean stop (SIGTERM, SIGINT) writes it a last time and leaves `cluster-state.clean`, naming its resourceVersion:
the next start goes on from that version, and a watch from it continues. Without the mark (a crash), changes made
after the last write are lost and their versions may have been seen by a client, so the counter jumps past them
and every older version is answered 410 Gone: clients list again, as after an etcd compaction.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from simulator.store import StoreSnapshot

STATE_FILE = "cluster-state.json"
CLEAN_MARK = "cluster-state.clean"
FORMAT = 1
CRASH_RV_JUMP = 1_000_000  # more changes than the simulator makes between two writes
WRITE_SHARE = 0.1  # a big fleet's file takes a while: never spend more than this share of the time writing it


def log(message: str) -> None:
    print(f"simulator: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Snapshot:
    """One consistent cut: the store, and the small JSON-ready parts the controllers hold (by section name)."""

    store: StoreSnapshot
    parts: dict[str, dict]


@dataclass(frozen=True)
class Saved:
    """A state file made for this fleet, as read at start."""

    document: dict
    clean: bool  # the file was written by a clean stop, and nothing ran after it

    @property
    def resource_version(self) -> int:
        """Where the counter goes on: where it stopped, or past any version a crashed run may have handed out."""
        saved = self.document["resource_version"]
        return saved if self.clean else saved + CRASH_RV_JUMP


class StateFile:
    """The state file of one state directory, for one fleet (seed, node count and the flags that shape it)."""

    def __init__(self, directory: Path, fleet: dict):
        self.path = directory / STATE_FILE
        self._mark = directory / CLEAN_MARK
        self._fleet = fleet

    def open(self, *, fresh: bool = False) -> Saved | None:
        """The saved state if there is one for this fleet (None otherwise, with a line on stderr saying why). The
        clean mark is used up here: from now on only another clean stop may pass for one."""
        try:
            clean_rv = int(self._mark.read_text())
        except (OSError, ValueError):
            clean_rv = None
        self._mark.unlink(missing_ok=True)
        if fresh:
            if self.path.exists():
                log(f"--fresh: ignoring {self.path}; starting a fresh fleet (the file will be replaced)")
            return None
        try:
            document = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            log(f"cannot read {self.path} ({error}); starting a fresh fleet (the file will be replaced)")
            return None
        saved_fleet = document.get("fleet") if document.get("format") == FORMAT else None
        if saved_fleet != self._fleet:
            log(
                f"ignoring {self.path}: it was saved for {_describe(saved_fleet)}, this simulator runs "
                f"{_describe(self._fleet)}; starting a fresh fleet (the file will be replaced)"
            )
            return None
        return Saved(document, clean=clean_rv == document["resource_version"])

    def write(self, snapshot: Snapshot, *, clean: bool = False) -> None:
        """Replace the file atomically; `clean` (the last write of a clean stop) also leaves the mark."""
        store = snapshot.store
        head = {
            "format": FORMAT,
            "fleet": self._fleet,
            "saved_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "resource_version": store.rv,
            "uids": store.uid_state,
            **snapshot.parts,
        }
        chunks = [json.dumps(head, separators=(",", ":"))[:-1].encode(), b',"objects":{']
        for index, (plural, entries) in enumerate(sorted(store.entries.items())):
            # Each entry's JSON is encoded once per version and cached: the API serves the same bytes.
            chunks += [b"," if index else b"", json.dumps(plural).encode(), b":[", b",".join(e.raw for e in entries)]
            chunks.append(b"]")
        chunks.append(b"}}\n")
        _replace(self.path, chunks)
        if clean:
            _replace(self._mark, [str(store.rv).encode()])


def _replace(path: Path, chunks: list[bytes]) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.writelines(chunks)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _describe(fleet: dict | None) -> str:
    if not fleet:
        return "another format"
    return " ".join(f"{key}={value}" for key, value in fleet.items())


class Persister:
    """Writes the state file from its own thread once something changed: `interval` seconds after the first change
    (a burst of changes makes one write), at most once per interval and within WRITE_SHARE of the time. The
    snapshot comes from `capture`, which must return a cut no controller step has half made."""

    def __init__(self, state_file: StateFile, capture: Callable[[], Snapshot], interval: float):
        self._file = state_file
        self._capture = capture
        self._interval = interval
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0

    def touch(self, *_: object) -> None:
        """Something changed (a store listener: it runs under the store's lock, so it only sets a flag)."""
        self._dirty.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sim-persist", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread (a write under way finishes first); the caller writes the last state itself."""
        self._stopping.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        pause = self._interval
        while True:
            self._dirty.wait()
            if self._stopping.wait(pause):
                return
            self._dirty.clear()
            started = time.monotonic()
            try:
                self._file.write(self._capture())
                self.writes += 1
            except Exception:  # a full disk or a slow controller step: the next change tries again
                self._dirty.set()
                traceback.print_exc()
            pause = max(self._interval, (time.monotonic() - started) * (1 - WRITE_SHARE) / WRITE_SHARE)
