"""`manage.py watch_clusters`: one long-lived process keeping every Kubernetes cluster's nodes current.

One watcher thread per cluster (worker.sync.ClusterWatcher: list, then watch from the list's resourceVersion).
The cluster list is re-read every `--rescan` seconds: new clusters get a watcher, removed ones lose theirs, a
cluster whose settings changed gets a fresh one. SIGTERM or SIGINT stops every watcher and exits 0.

Never two watchers for one cluster, across processes and hosts: each watcher first takes a lock that its holder
keeps for its lifetime and that dies with it (no expiry to tune, no stale lease after a crash):
- PostgreSQL: a session-level advisory lock, `pg_try_advisory_lock(<namespace>, <cluster id>)`, on a
  connection of its own held by this process;
- SQLite: `flock()` on a file beside the database file. SQLite is only shared between processes on one host
  (the file is local), so an OS lock on that host is exact; it is released by the kernel when the process dies.
A process that cannot take a cluster's lock leaves that cluster alone and tries again at the next rescan, so a
standby `watch_clusters` takes over within one rescan of the active one stopping.
"""

import fcntl
import logging
import os
import signal
import threading
from pathlib import Path

from django.core.management.base import BaseCommand
from django.db import close_old_connections, connections

from fleet.choices import ClusterDriver
from fleet.models import Cluster

log = logging.getLogger(__name__)

ADVISORY_NAMESPACE = 0x7E55  # first key of the two-int advisory lock: "Tessera cluster watcher"


class ClusterLock:
    """The right to watch one cluster (see the module docstring). `acquire()` never blocks."""

    def __init__(self, cluster_id: int, alias: str = "default"):
        self.cluster_id = cluster_id
        self.alias = alias
        self._file = None
        self._connection = None

    def acquire(self) -> bool:
        vendor = connections[self.alias].vendor
        if vendor == "postgresql":
            connection = connections.create_connection(self.alias)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [ADVISORY_NAMESPACE, self.cluster_id])
                held = cursor.fetchone()[0]
            if held:
                self._connection = connection
            else:
                connection.close()
            return bool(held)
        if vendor == "sqlite":
            path = Path(str(connections[self.alias].settings_dict["NAME"]) + f".watch-cluster-{self.cluster_id}.lock")
            handle = open(path, "a+")  # noqa: SIM115 - held open while the lock is held
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                return False
            self._file = handle
            return True
        raise RuntimeError(f"watch_clusters has no lock for the {vendor} database")

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
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [ADVISORY_NAMESPACE, self.cluster_id])
            except Exception:
                pass  # the session ends below either way, and with it the lock
            self._connection.close()
            self._connection = None
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def _fingerprint(cluster: Cluster) -> tuple:
    """What a running watcher depends on; a change restarts it (updated_at moves on every edit)."""
    return (cluster.updated_at, cluster.kubeconfig_path, cluster.in_cluster, cluster.operator_namespace)


class Supervisor:
    """Watcher threads per cluster, reconciled against the cluster table by `rescan()`."""

    def __init__(self, *, watcher_options: dict | None = None):
        self.watcher_options = watcher_options or {}
        self.running: dict[int, tuple[tuple, object, threading.Thread, ClusterLock]] = {}

    def rescan(self) -> None:
        clusters = {c.pk: c for c in Cluster.objects.filter(driver=ClusterDriver.KUBERNETES)}
        for cluster_id, (fingerprint, _, thread, lock) in list(self.running.items()):
            cluster = clusters.get(cluster_id)
            if cluster is None or _fingerprint(cluster) != fingerprint or not thread.is_alive() or not lock.alive():
                self._stop(cluster_id)
        for cluster_id, cluster in clusters.items():
            if cluster_id not in self.running:
                self._start(cluster)

    def _start(self, cluster: Cluster) -> None:
        from worker.sync import ClusterWatcher

        lock = ClusterLock(cluster.pk)
        if not lock.acquire():
            log.info("cluster %s is watched by another process; leaving it", cluster.name)
            return
        watcher = ClusterWatcher(cluster, **self.watcher_options)
        thread = threading.Thread(target=watcher.run, name=f"watch-cluster-{cluster.pk}", daemon=True)
        thread.start()
        self.running[cluster.pk] = (_fingerprint(cluster), watcher, thread, lock)
        log.info("watching cluster %s", cluster.name)

    def _stop(self, cluster_id: int, timeout: float = 10.0) -> None:
        _, watcher, thread, lock = self.running.pop(cluster_id)
        watcher.stop()
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the watcher of cluster %s did not stop within %.0f s", cluster_id, timeout)
        lock.release()

    def stop_all(self) -> None:
        for cluster_id in list(self.running):
            self._stop(cluster_id)

    def watchers(self) -> dict[int, object]:
        return {cluster_id: entry[1] for cluster_id, entry in self.running.items()}


class Command(BaseCommand):
    help = "Watch the nodes of every Kubernetes cluster (one thread each) until SIGTERM."

    def add_arguments(self, parser):
        parser.add_argument("--rescan", type=float, default=30.0, help="Seconds between re-reads of the cluster list.")

    def handle(self, *args, rescan: float, **options):
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *a: stop.set())
        supervisor = Supervisor()
        self.stdout.write(f"watch_clusters: pid {os.getpid()}, rescanning clusters every {rescan:g} s")
        try:
            while not stop.is_set():
                try:
                    supervisor.rescan()
                except Exception:
                    log.exception("rescanning the cluster list failed; trying again")
                finally:
                    close_old_connections()
                stop.wait(rescan)
        finally:
            supervisor.stop_all()
        self.stdout.write("watch_clusters: stopped")
