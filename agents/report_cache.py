"""What the report path reads of a credential, per process, kept true by PostgreSQL's notifications.

Every agent report is authenticated by one statement: the credential, its node and the node's serving change
(agents/statements.credential_row). On PostgreSQL that round trip cost ~0.38 ms of the 1.33 ms of CPU a report cost
the box, both sides counted (bench/README.md, B2), yet those rows seldom change: a revocation, a rollout step, a new
inventory.
So each web process keeps what it read, and drops it when the database says it changed:

- triggers (agents/migrations/0001_report_cache_notify.py) run `pg_notify(CHANNEL, <node id>)` whenever a column
  the statement reads changes (a credential revoked or deleted, the node's state, any change of its NodeChanges),
  and '*' on TRUNCATE; PostgreSQL delivers a notification when its transaction commits;
- one listener thread per process LISTENs on its own connection and drops the node's entries.

Rows are served from memory only while the listener is known to hear: it has received a notification (its own ping
every HEARTBEAT seconds at least) within LIVENESS seconds. Otherwise, or before the first ping came back (a
transaction-pooling PgBouncer never delivers it), every report reads the database as before. A row read before an
invalidation it raced with is not kept (`generation`). An entry older than TESSERA["AGENT_REPORT_CACHE_SECONDS"]
is read again whatever was heard; 0 turns the cache off (the tests' default: their transactions never commit, so
nothing would be notified). SQLite has no notifications: no cache.
"""

import dataclasses
import logging
import os
import threading
import time

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

log = logging.getLogger(__name__)

CHANNEL = "tessera_agent_nodes"
PING = "ping"
EVERYTHING = "*"  # the payload of a TRUNCATE: drop every entry
HEARTBEAT = 5.0  # seconds between the listener's pings
LIVENESS = 15.0  # entries are served only this long after the listener last heard a notification
RETRY = (1.0, 30.0)  # the listener reconnects after 1 s, doubling up to 30 s
MAX_ENTRIES = 50_000  # ~2 KB each: a 10,000-node fleet's credentials several times over


@dataclasses.dataclass
class Entry:
    row: tuple
    node_id: int
    stored_at: float


class ReportCache:
    """Credential rows by key id, for this process; `get`, `generation` and `put` are the report path's calls."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self):
        """Also the child's state after a fork: it inherits neither the lock's state, the thread nor its entries."""
        self.lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.by_node: dict[int, set[str]] = {}
        self.generation_count = 0
        self.heard_at = -LIVENESS  # monotonic time of the last notification heard (a ping included)
        self.thread: threading.Thread | None = None
        self.stopping = threading.Event()
        self.warned = False

    @staticmethod
    def max_age() -> float:
        return settings.TESSERA.get("AGENT_REPORT_CACHE_SECONDS", 0)

    def live(self) -> bool:
        return time.monotonic() - self.heard_at < LIVENESS

    def get(self, key_id: str) -> tuple | None:
        """The row stored for this key id, if the listener hears and the entry is younger than the max age."""
        entry = self.entries.get(key_id)
        if entry is None or not self.live() or time.monotonic() - entry.stored_at >= self.max_age():
            return None
        return entry.row

    def generation(self) -> int | None:
        """Taken before reading a row from the database, handed to `put`; None: the cache is off, keep nothing.
        Starts this process's listener the first time it is asked."""
        if self.max_age() <= 0 or connections[DEFAULT_DB_ALIAS].vendor != "postgresql":
            return None
        if self.thread is None:
            self.start()
        return self.generation_count if self.live() else None

    def put(self, key_id: str, node_id: int, row: tuple, generation: int | None) -> None:
        """Keep a row read since `generation`, unless an invalidation came in meanwhile (the row may predate it)."""
        if generation is None:
            return
        with self.lock:
            if generation != self.generation_count:
                return
            if key_id not in self.entries and len(self.entries) >= MAX_ENTRIES:
                self._drop_key(next(iter(self.entries)))  # the oldest stored
            self.entries[key_id] = Entry(row, node_id, time.monotonic())
            self.by_node.setdefault(node_id, set()).add(key_id)

    def replace(self, key_id: str, row: tuple) -> None:
        """The row of an entry after the report path wrote it itself (a credential's last-use time)."""
        with self.lock:
            entry = self.entries.get(key_id)
            if entry is not None:
                entry.row = row

    def drop_node(self, node_id: int) -> None:
        with self.lock:
            self.generation_count += 1
            for key_id in self.by_node.pop(node_id, ()):
                self.entries.pop(key_id, None)

    def clear(self) -> None:
        with self.lock:
            self.generation_count += 1
            self.entries.clear()
            self.by_node.clear()

    def _drop_key(self, key_id: str) -> None:
        entry = self.entries.pop(key_id)
        keys = self.by_node.get(entry.node_id)
        if keys is not None:
            keys.discard(key_id)
            if not keys:
                del self.by_node[entry.node_id]

    def heard(self, payload: str) -> None:
        """A notification: any proves the listener hears; a node id drops that node's entries, '*' all."""
        if payload == EVERYTHING:
            self.clear()
        elif payload != PING:
            try:
                node_id = int(payload)
            except ValueError:
                log.warning("ignoring a notification on %s: %r", CHANNEL, payload[:100])
            else:
                self.drop_node(node_id)
        self.heard_at = time.monotonic()

    # --- the listener ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        with self.lock:
            if self.thread is not None:
                return
            self.stopping.clear()
            self.thread = threading.Thread(target=self._run, name="agent-report-cache", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """Stop the listener (tests): nothing is served from memory afterwards."""
        thread = self.thread
        self.stopping.set()
        if thread is not None:
            thread.join(timeout=5)
        with self.lock:
            self.thread = None
        self.heard_at = -LIVENESS
        self.clear()

    def _run(self) -> None:
        delay = RETRY[0]
        while not self.stopping.is_set():
            try:
                self._listen()
                delay = RETRY[0]
            except Exception:  # a lost connection: read the database until listening again
                self.heard_at = -LIVENESS
                self.clear()
                log.warning("agent report cache: listener lost; again in %.0f s", delay, exc_info=True)
                self.stopping.wait(delay)
                delay = min(delay * 2, RETRY[1])

    def _listen(self) -> None:
        """LISTEN, ping until stopped. Entries are kept only once this session's first ping came back: every
        change committed from then on reaches us; what was stored before (nothing, or another session's) goes."""
        params = connections[DEFAULT_DB_ALIAS].get_connection_params()
        params.setdefault("application_name", "tessera-agent-report-cache")
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            started = time.monotonic()
            first, ping_at = True, 0.0
            while not self.stopping.is_set():
                if time.monotonic() >= ping_at:
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, PING))
                    ping_at = time.monotonic() + HEARTBEAT
                for notify in conn.notifies(timeout=1.0):  # back within a second to ping, or to stop
                    if first and notify.payload == PING and notify.pid == conn.info.backend_pid:
                        self.clear()  # before this ping, changes may have gone unheard
                        first = False
                    if not first:
                        self.heard(notify.payload)
                if first and not self.warned and time.monotonic() > started + HEARTBEAT:
                    self.warned = True
                    log.warning(
                        "the agent report cache's ping did not come back within %.0f s (a transaction-pooling "
                        "PgBouncer?): agent reports read PostgreSQL each time",
                        HEARTBEAT,
                    )


report_cache = ReportCache()
