"""The simulated cluster on disk: what an admin or Tessera changed survives a restart of `python -m simulator`.

`<state dir>/cluster-state.json` holds every stored object (nodes with their labels, taints and status, pods,
ConfigMaps, the ClusterPolicy, admission objects, Events), the resourceVersion counter, and what the simulated
hardware and GPU Operator hold in memory (MIG layouts, why an apply failed, the config each device plugin runs).
It is replaced atomically (temp file, fsync, rename), so a reader sees the previous state or the next, never half.

A clean stop (SIGTERM, SIGINT) writes it a last time and says so in `cluster-state.run`: the next start goes on from
that resourceVersion, and a watch from it continues. Otherwise (a crash), changes made after the last write are lost
and their versions may have been seen by a client, so the counter jumps past every version the run may have handed
out and older versions are answered 410 Gone: clients list again, as after an etcd compaction. A fresh fleet in a
directory that held one starts above the old versions too.
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
RUN_FILE = "cluster-state.run"  # {"rv": where this run's versions start, or where a clean stop left them; "clean"}
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
class Start:
    """What a start finds in the state directory."""

    document: dict | None  # the saved cluster, when it is for this fleet
    clean: bool  # it was written by a clean stop, and nothing ran after it
    resource_version: int  # where this run's counter starts: above every version an earlier run may have handed out


class StateFile:
    """The state file of one state directory, for one fleet (seed, node count and the flags that shape it)."""

    def __init__(self, directory: Path, fleet: dict):
        self.path = directory / STATE_FILE
        self._run = directory / RUN_FILE
        self._fleet = fleet

    def open(self, *, fresh: bool = False) -> Start:
        """The saved state if there is one for this fleet (else a line on stderr says why it is not used), and where
        the counter starts. From here on the directory says "not stopped cleanly" until this run stops cleanly."""
        run = _read_json(self._run) or {}
        document = _read_json(self.path)
        earlier = max(run.get("rv", 0), document.get("resource_version", 0) if document else 0)
        if document is not None and (fresh or document.get("format") != FORMAT or document.get("fleet") != self._fleet):
            saved_for = _describe(document.get("fleet")) if document.get("format") == FORMAT else "another format"
            why = "--fresh" if fresh else f"it was saved for {saved_for}, this simulator runs {_describe(self._fleet)}"
            log(f"ignoring {self.path}: {why}; starting a fresh fleet (the file will be replaced)")
            document = None
        clean = document is not None and run.get("clean") is True and run.get("rv") == document["resource_version"]
        rv = document["resource_version"] if clean else earlier + CRASH_RV_JUMP if earlier else 0
        _replace(self._run, [json.dumps({"rv": rv, "clean": False}).encode()])
        return Start(document, clean, rv)

    def write(self, snapshot: Snapshot, *, clean: bool = False) -> None:
        """Replace the file atomically; `clean` (the last write of a clean stop) also says so in the run file."""
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
            _replace(self._run, [json.dumps({"rv": store.rv, "clean": True}).encode()])


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log(f"cannot read {path} ({error}); it is ignored")
        return None
    return value if isinstance(value, dict) else None


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


def _describe(fleet: object) -> str:
    return " ".join(f"{key}={value}" for key, value in fleet.items()) if isinstance(fleet, dict) else repr(fleet)


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
            except Exception:  # a full disk or a slow controller step: the next change tries again
                self._dirty.set()
                traceback.print_exc()
            pause = max(self._interval, (time.monotonic() - started) * (1 - WRITE_SHARE) / WRITE_SHARE)
