"""The node watch: list a cluster's GPU nodes, then follow them from the list's resourceVersion; beside it, the
`gpu.nvidia.com` ResourceSlices of DRA nodes (their GPUs and MIG devices, docs/nvidia-contracts.md §13), batched
the same way."""

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass

import urllib3
from django.db import connections
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from fleet.services import cluster_record_contact, inventory_record
from sharing.dra import DRIVER
from worker.drivers.kubernetes import api as k8s
from worker.drivers.kubernetes.labels import GPU_NODE_SELECTOR
from worker.inventory.cluster import cluster_health, record_pools, sync_cluster_full
from worker.inventory.gpustack import read_dra
from worker.inventory.nodes import node_observation
from worker.telemetry import api_errors_flush, watch_record

log = logging.getLogger(__name__)

BATCH_SECONDS = 0.5
WATCH_SECONDS = 300  # server-side timeout of one watch request; the watcher resumes from the last version
HEALTH_EVERY_SECONDS = 300
CONTACT_EVERY_SECONDS = 10
BACKOFF_START, BACKOFF_CAP = 0.5, 30.0


class _RawWatch(watch.Watch):
    """Events as the JSON dicts of the wire (no model deserialisation); resource versions tracked by the caller."""

    def get_return_type(self, func):
        return None


_END = object()


class _SliceEvent:
    """An event of the ResourceSlice stream, on the same queue as the node events."""

    __slots__ = ("event",)

    def __init__(self, event: dict):
        self.event = event


class _StreamFailed(Exception):
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error
        self.progressed = False


@dataclass
class WatchStats:
    """Counters for tests, benchmarks and logs."""

    lists: int = 0
    streams: int = 0
    events: int = 0
    batches: int = 0
    errors: int = 0
    disconnects: int = 0
    gone: int = 0
    last_batch_nodes: int = 0
    resource_version: str = ""
    slice_events: int = 0
    slice_relists: int = 0
    pool_batches: int = 0
    last_batch_pools: int = 0


class ClusterWatcher:
    """List, then watch a cluster's GPU nodes from the list's resourceVersion; resume from the last version seen
    when a stream ends or is cut, re-list on 410 Gone, back off (capped, jittered) on errors. Records connection
    health: reachable or the error, and the health check's problem (re-checked every few minutes)."""

    def __init__(self, cluster, stop_event: threading.Event | None = None, *, gpus_on_start: bool = True,
                 batch_seconds: float = BATCH_SECONDS, watch_seconds: int = WATCH_SECONDS,
                 on_batch=None):  # fmt: skip
        self.cluster = cluster
        self.stop_event = stop_event or threading.Event()
        self.gpus_on_start = gpus_on_start
        self.batch_seconds = batch_seconds
        self.watch_seconds = watch_seconds
        self.on_batch = on_batch
        self.stats = WatchStats()
        self.version: str | None = None  # where the next watch starts; None: list first
        self._watch: _RawWatch | None = None
        self._warnings: dict[str, str] = {}
        self._health_problem: str | None = None
        self._health_at = 0.0
        self._recorded: object = object()
        self._recorded_at = 0.0
        self._seen: str | None = None  # the newest version seen on the stream (recorded or pending)
        self._dra = None  # gpustack.DraView of the last listing, kept current by the slice stream
        self._pools_pending: set[str] = set()  # DRA nodes whose pool changed since the last recording
        self._slice_watch: _RawWatch | None = None

    def stop(self) -> None:
        self.stop_event.set()
        for current in (self._watch, self._slice_watch):
            if current is not None:
                current.stop()  # shuts the socket down: the reader thread wakes at once

    def run(self) -> None:
        backoff, first = BACKOFF_START, True
        try:
            while not self.stop_event.is_set():
                try:
                    if self.version is None:
                        self._list(gpus=first and self.gpus_on_start)
                        first = False
                    self._stream()
                    backoff = BACKOFF_START
                except _Relist:
                    self.version = None
                except Exception as exc:
                    error = exc.error if isinstance(exc, _StreamFailed) else exc
                    if isinstance(error, ApiException) and error.status == 410:
                        self.stats.gone += 1
                        log.info("watch of %s: resource version too old, listing again", self.cluster.name)
                        self.version = None
                        continue
                    if isinstance(exc, _StreamFailed) and exc.progressed and _is_cut(error):
                        self.stats.disconnects += 1  # a cut stream that delivered events: resume at once
                        continue
                    self.stats.errors += 1
                    if isinstance(exc, _StreamFailed):  # failed calls of the listing were counted by k8s.call
                        k8s.count_error(self.cluster.pk, error)
                    text = f"{self.cluster.name}: {k8s.error_text(error)}"
                    log.warning("watch of %s failed (retrying in %.1f s): %s", self.cluster.name, backoff, text)
                    self._record(text, reached=False)
                    self.stop_event.wait(backoff * random.uniform(0.5, 1.0))
                    backoff = min(BACKOFF_CAP, backoff * 2)
        finally:
            try:
                watch_record(self.cluster.pk, connected=False, error="the watcher stopped")
                api_errors_flush()
            except Exception:  # the database may be what stopped us; the heartbeat's age tells the rest
                log.warning("could not record the end of the watch of %s", self.cluster.name, exc_info=True)
            connections.close_all()  # this thread's connections: a watcher thread ends for good

    def _list(self, *, gpus: bool) -> None:
        # Utilisation is left to the periodic scrape (worker.tasks.cluster_scrape_metrics): the watch starts sooner.
        result = sync_cluster_full(self.cluster, gpus=gpus, metrics=False, record_contact=False)
        self._warnings = result.warnings
        self._dra, self._pools_pending = result.dra, set()
        self.stats.lists += 1
        self.version = self.stats.resource_version = result.resource_version
        watch_record(self.cluster.pk, connected=True, listed=True)
        self._check_health(force=True)

    def _check_health(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._health_at > HEALTH_EVERY_SECONDS:
            self._health_at = now
            self._health_problem = cluster_health(self.cluster, record=False).problem
        self._record(None, reached=True)

    def _record(self, error: str | None, *, reached: bool) -> None:
        """Write the cluster's connection state when it changes, and the contact time at most every few seconds."""
        problem = error if error is not None else self._health_problem
        now = time.monotonic()
        if problem == self._recorded and now - self._recorded_at < CONTACT_EVERY_SECONDS:
            return
        self._recorded, self._recorded_at = problem, now
        cluster_record_contact(self.cluster, problem, reached=reached)
        watch_record(self.cluster.pk, connected=reached, error=problem or "")  # the heartbeat /readyz and /metrics read
        api_errors_flush()

    def _stream(self) -> None:
        """One watch request from `self.version`, until the server ends it; events are recorded in batches."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        stream_watch = self._watch = _RawWatch()
        core = client.CoreV1Api(k8s.api_client(self.cluster))
        started_at = self._seen = self.version

        def read():
            try:
                for event in stream_watch.stream(
                    core.list_node,
                    label_selector=GPU_NODE_SELECTOR,
                    resource_version=started_at,
                    timeout_seconds=self.watch_seconds,
                    allow_watch_bookmarks=True,
                    _request_timeout=(10, self.watch_seconds + 30),
                ):
                    events.put(event)
                events.put(_END)
            except BaseException as exc:  # handed to the loop, which decides: resume, re-list or back off
                events.put(_StreamFailed(exc))

        reader = threading.Thread(target=read, name=f"watch-{self.cluster.pk}", daemon=True)
        reader.start()
        if self._dra is not None and self._dra.version:
            self._start_slice_reader(events)
        self.stats.streams += 1
        pending: dict[str, dict] = {}
        first_at = None
        try:
            while True:
                wait = 1.0 if first_at is None else max(0.0, first_at + self.batch_seconds - time.monotonic())
                try:
                    item = events.get(timeout=wait)
                except queue.Empty:
                    item = None
                if self.stop_event.is_set():
                    self._flush(pending)
                    return
                if item is None:
                    if pending and time.monotonic() - first_at >= self.batch_seconds:
                        self._flush(pending)
                        first_at = None
                    self._check_health()
                    continue
                if item is _END:
                    self._flush(pending)
                    return
                if isinstance(item, _StreamFailed):
                    self._flush(pending)
                    item.progressed = self.version != started_at
                    raise item
                if isinstance(item, _SliceEvent):
                    if self._on_slice(item.event, events):
                        first_at = first_at or time.monotonic()
                    if first_at is not None and time.monotonic() - first_at >= self.batch_seconds:
                        self._flush(pending)
                        first_at = None
                    continue
                kind, obj = item.get("type"), item.get("raw_object") or item.get("object") or {}
                meta = obj.get("metadata") or {}
                if kind == "DELETED":
                    # Gone nodes are marked by a complete listing, the one place that knows what is absent.
                    self._flush(pending)
                    raise _Relist()
                if kind in ("ADDED", "MODIFIED"):
                    pending[meta["name"]] = obj
                    self.stats.events += 1
                    first_at = first_at or time.monotonic()
                # Recorded events and bookmarks both move the resume point (after the flush that records them).
                if time.monotonic() - (first_at or 0) >= self.batch_seconds:
                    self._flush(pending)
                    first_at = None
                self._advance(meta.get("resourceVersion"), pending)
        finally:
            stream_watch.stop()
            self._watch = None
            if self._slice_watch is not None:
                self._slice_watch.stop()
                self._slice_watch = None

    def _start_slice_reader(self, events: queue.SimpleQueue) -> None:
        """Follow the `gpu.nvidia.com` ResourceSlices from the listing's (or the last event's) version."""
        slice_watch = self._slice_watch = _RawWatch()
        resources = client.ResourceV1Api(k8s.api_client(self.cluster))
        since = self._dra.version

        def read():
            try:
                for event in slice_watch.stream(
                    resources.list_resource_slice,
                    field_selector=f"spec.driver={DRIVER}",
                    resource_version=since,
                    timeout_seconds=self.watch_seconds,
                    allow_watch_bookmarks=True,
                    _request_timeout=(10, self.watch_seconds + 30),
                ):
                    events.put(_SliceEvent(event))
            except BaseException as exc:
                events.put(_SliceEvent({"type": "FAILED", "error": exc}))

        threading.Thread(target=read, name=f"watch-slices-{self.cluster.pk}", daemon=True).start()

    def _on_slice(self, event: dict, events: queue.SimpleQueue) -> bool:
        """Apply a slice event to the DRA view; True when a pool changed (to be recorded with the next batch). A cut
        stream resumes at once from the last version; on 410 Gone the slices alone are listed again (every DRA node
        re-recorded) and followed from there; another error waits for the next node stream."""
        kind = event.get("type")
        if kind == "FAILED":
            error = event["error"]
            if isinstance(error, ApiException) and error.status == 410:
                self.stats.slice_relists += 1
                fresh = read_dra(k8s.api_client(self.cluster))
                if fresh is None:
                    return False
                self._pools_pending |= set(self._dra.slices) | set(fresh.slices)
                self._dra = fresh
                self._start_slice_reader(events)
                return bool(self._pools_pending)
            if _is_cut(error):
                self._start_slice_reader(events)
            else:
                log.warning("slice watch of %s failed: %s", self.cluster.name, k8s.error_text(error))
            return False
        obj = event.get("raw_object") or event.get("object") or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        changed = False
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            node = self._dra.apply(kind, obj)
            if node:
                self._pools_pending.add(node)
                self.stats.slice_events += 1
                changed = True
        if version:
            self._dra.version = version
        return changed

    def _flush_pools(self) -> None:
        if not self._pools_pending or self._dra is None:
            return
        names = set(self._pools_pending)
        self.stats.last_batch_pools = record_pools(self.cluster, self._dra, names)
        self._pools_pending -= names
        self.stats.pool_batches += 1

    def _advance(self, version: str | None, pending: dict) -> None:
        """Resume from `version` only once nothing older is left unrecorded (a cut stream then loses nothing)."""
        if not version:
            return
        self._seen = version
        if not pending:
            self.version = self.stats.resource_version = version

    def _flush(self, pending: dict[str, dict]) -> None:
        self._flush_pools()
        if not pending:
            return
        observations = [node_observation(obj, warning=self._warnings.get(name, "")) for name, obj in pending.items()]
        inventory_record(cluster=self.cluster, nodes=observations)
        self.stats.batches += 1
        self.stats.last_batch_nodes = len(observations)
        pending.clear()
        if self._seen:
            self.version = self.stats.resource_version = self._seen
        self._record(None, reached=True)
        if self.on_batch is not None:
            self.on_batch(self.stats)


def _is_cut(error: BaseException) -> bool:
    """The connection broke mid-stream (a load balancer, an API server restart): resume, it is not a failure."""
    return isinstance(error, urllib3.exceptions.ProtocolError | urllib3.exceptions.ReadTimeoutError | ConnectionError)


class _Relist(Exception):
    """Start over with a complete listing (a node left the cluster)."""
