"""The coalescing buffer of unchanged agent reports, flushed by one thread per process.

AgentsConfig.ready starts the thread when TESSERA["AGENT_REPORT_FLUSH_SECONDS"] is above 0; at 0 reports are written
at once and nothing starts. A forked child (a pre-forking server's worker) starts its own thread.
"""

import atexit
import logging
import os
import threading
import time

from django.db import connection
from django.db.models import F

from agents.statements import write_reports
from fleet.models import Node

log = logging.getLogger(__name__)


class ReportBuffer:
    """The writes of unchanged reports (metrics, processes, last-seen), coalesced per process and written by one
    transaction per flush instead of one per report: the usual report then costs no write of its own, and the
    workers of a SQLite deployment stop queueing for its write lock. Soft state only: a crash loses at most one
    flush interval of it, and the agent reports again within its interval. Inventory changes, events and outcomes
    are written at once."""

    def __init__(self):
        self.interval = 0.0
        self._reset()
        os.register_at_fork(after_in_child=self._after_fork)
        atexit.register(self._flush_at_exit)

    def _reset(self):
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[list, list]] = {}
        self.thread: threading.Thread | None = None

    def _after_fork(self):
        """The child inherits neither the parent's lock state nor its thread: a fresh lock, and its own thread."""
        self._reset()
        if self.interval > 0:
            self.start(self.interval)

    def start(self, interval: float) -> None:
        """Flush every `interval` seconds from a daemon thread (once per process; later calls change nothing)."""
        with self.lock:
            if self.thread is not None:
                return
            self.interval = interval
            self.thread = threading.Thread(target=self._run, args=(interval,), name="agent-report-flush", daemon=True)
            self.thread.start()

    def add(self, node_id: int, metric_rows: list, seen_row: list) -> None:
        with self.lock:
            self.pending[node_id] = (metric_rows, seen_row)  # a newer report of the node replaces an older one

    def discard(self, node_id: int) -> None:
        with self.lock:
            self.pending.pop(node_id, None)

    def flush(self) -> int:
        """Write what is pending in one transaction; returns the number of reports written. Should the batch fail,
        whatever the error, each node's report is written on its own: a bad row costs only its own node's report,
        which is counted (Node.agent_reports_dropped, `tessera_agent_reports_dropped_total`) and logged."""
        with self.lock:
            pending, self.pending = self.pending, {}
        if not pending:
            return 0
        node_ids = sorted(pending)
        try:
            write_reports([pending[node_id] for node_id in node_ids])
            return len(node_ids)
        except Exception as error:
            if len(node_ids) == 1:
                _count_dropped(node_ids[0], error)
                return 0
            log.warning("a batch of %d buffered agent reports failed; writing them one by one", len(node_ids))
        written = 0
        for node_id in node_ids:
            try:
                write_reports([pending[node_id]])
                written += 1
            except Exception as error:
                _count_dropped(node_id, error)
        return written

    def _flush_at_exit(self) -> None:
        try:
            self.flush()
        except Exception:  # the database may be gone already (tests, a shut-down server)
            log.warning("buffered agent reports were not written at exit", exc_info=True)

    def _run(self, interval: float) -> None:
        while True:
            time.sleep(interval)
            try:
                self.flush()
            except Exception:  # a lost flush is one interval of metrics; the loop must go on
                log.exception("writing buffered agent reports failed")
                connection.close()
            connection.close_if_unusable_or_obsolete()  # a connection the database broke is replaced


def _count_dropped(node_id: int, error: Exception) -> None:
    """A node's buffered report the database would not take: counted on its node and logged with its name. The rows
    were checked against the protocol's bounds (agent/protocol.py) when the report came in: this is a bug, or the
    database in trouble, and the report is lost (the agent sends another within its interval)."""
    log.error("the buffered report of node %s (id %s) was not written", _node_name(node_id), node_id, exc_info=error)
    try:
        Node.objects.filter(pk=node_id).update(agent_reports_dropped=F("agent_reports_dropped") + 1)
    except Exception:  # the database itself is in trouble: the log line stands
        log.warning("the dropped report of node id %s was not counted", node_id, exc_info=True)


def _node_name(node_id: int) -> str:
    try:
        return Node.objects.filter(pk=node_id).values_list("name", flat=True).first() or "(gone)"
    except Exception:
        return "(unknown)"


report_buffer = ReportBuffer()
