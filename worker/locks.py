"""Per-cluster locks between processes and hosts that never block, never expire and die with their holder (no lease
to tune, nothing stale after a crash). A namespace keeps unrelated holders apart: the watcher of a cluster and its
admission sync each take their own lock of the same cluster.

- PostgreSQL: a session-level advisory lock, `pg_try_advisory_lock(<namespace key>, <cluster id>)`, on a
  connection of its own held by this process;
- SQLite: `flock()` on a file beside the database file. SQLite is only shared between processes on one host
  (the file is local), so an OS lock on that host is exact; it is released by the kernel when the process dies.
"""

import fcntl
from dataclasses import dataclass
from pathlib import Path

from django.db import connections


@dataclass(frozen=True)
class LockNamespace:
    """The first key of the two-int advisory lock on PostgreSQL, and the lock file's name on SQLite."""

    key: int
    name: str


WATCH = LockNamespace(0x7E55, "watch-cluster")  # `manage.py watch_clusters`: one watcher per cluster
ADMISSION = LockNamespace(0x7E56, "admission-sync")  # one admission pass per cluster at a time
KUEUE = LockNamespace(0x7E57, "kueue-sync")  # one Kueue quota pass per pool at a time (keyed by the pool id)


class ClusterLock:
    """The right to work on one cluster in one namespace (see the module docstring). `acquire()` never blocks."""

    def __init__(self, cluster_id: int, namespace: LockNamespace = WATCH, alias: str = "default"):
        self.cluster_id = cluster_id
        self.namespace = namespace
        self.alias = alias
        self._file = None
        self._connection = None

    def acquire(self) -> bool:
        vendor = connections[self.alias].vendor
        if vendor == "postgresql":
            connection = connections.create_connection(self.alias)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [self.namespace.key, self.cluster_id])
                held = cursor.fetchone()[0]
            if held:
                self._connection = connection
            else:
                connection.close()
            return bool(held)
        if vendor == "sqlite":
            name = str(connections[self.alias].settings_dict["NAME"])
            path = Path(f"{name}.{self.namespace.name}-{self.cluster_id}.lock")
            handle = open(path, "a+")  # noqa: SIM115 - held open while the lock is held
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                return False
            self._file = handle
            return True
        raise RuntimeError(f"no cluster lock for the {vendor} database")

    def alive(self) -> bool:
        """Still ours? (An advisory lock dies with its connection, e.g. after a database restart.)"""
        if self._connection is not None:
            try:
                with self._connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
                return True
            except Exception:
                return False
        return self._file is not None

    def release(self) -> None:
        if self._connection is not None:
            try:
                with self._connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [self.namespace.key, self.cluster_id])
            except Exception:
                pass  # the session ends below either way, and with it the lock
            self._connection.close()
            self._connection = None
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
