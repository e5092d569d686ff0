"""`manage.py watch_clusters`: one long-lived process keeping every Kubernetes cluster's nodes current.

One watcher thread per cluster (worker.inventory.watch.ClusterWatcher: list, then watch from the list's
resourceVersion). The cluster list is re-read every `--rescan` seconds: new clusters get a watcher, removed ones
lose theirs, a cluster whose settings changed gets a fresh one. SIGTERM or SIGINT stops every watcher and exits 0.

Never two watchers for one cluster, across processes and hosts: each watcher first takes the cluster's lock
(worker.locks.ClusterLock, namespace WATCH) that its holder keeps for its lifetime and that dies with it.
A process that cannot take a cluster's lock leaves that cluster alone and tries again at the next rescan, so a
standby `watch_clusters` takes over within one rescan of the active one stopping.
"""

import logging
import os
import signal
import threading

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from fleet.choices import ClusterDriver
from fleet.models import Cluster
from worker.inventory.watch import ClusterWatcher
from worker.locks import WATCH, ClusterLock

log = logging.getLogger(__name__)


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
        lock = ClusterLock(cluster.pk, WATCH)
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
