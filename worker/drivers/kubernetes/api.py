"""Talking to one cluster's API server with the official client: one ApiClient per cluster, raw JSON reads,
retries with backoff and jitter, bounded concurrency, and error texts that never carry credentials."""

import gc
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.kube_config import KubeConfigLoader

from fleet.cluster_access import AccessRefused, kubeconfig_read
from worker.drivers.base import DriverError

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# HTTP in threads only (never the ORM): a small pool per call keeps one slow node from stalling a batch.
THREADS = 16
REQUEST_TIMEOUT = (5, 30)  # connect, read (seconds)
RETRY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})

_clients: dict[int, tuple[object, client.ApiClient]] = {}
_clients_lock = threading.Lock()


def api_client(cluster) -> client.ApiClient:
    """The cluster's ApiClient, cached per cluster id and `updated_at` (a changed kubeconfig path rebuilds it)."""
    key = (cluster.updated_at, cluster.kubeconfig_path, cluster.in_cluster)
    with _clients_lock:
        cached = _clients.get(cluster.pk)
        if cached and cached[0] == key:
            return cached[1]
    configuration = client.Configuration()
    try:
        if cluster.in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            # Read and checked here (directory, no credential plugin), then loaded from what was checked.
            kubeconfig, path = kubeconfig_read(cluster.kubeconfig_path)
            loader = KubeConfigLoader(config_dict=kubeconfig, config_base_path=str(path.parent))
            loader.load_and_set(configuration)
    except AccessRefused as exc:
        raise DriverError(f"cannot load the kubeconfig credentials of cluster {cluster.name}: {exc}") from None
    except Exception as exc:  # the path and the file's content stay out of logs and error texts
        source = "in-cluster service account" if cluster.in_cluster else "kubeconfig"
        raise DriverError(
            f"cannot load the {source} credentials of cluster {cluster.name} ({type(exc).__name__})"
        ) from None
    configuration.connection_pool_maxsize = THREADS * 2
    api = client.ApiClient(configuration)
    api.tessera_cluster_id = cluster.pk  # failed calls are counted per cluster (count_error)
    with _clients_lock:
        old = _clients.get(cluster.pk)
        _clients[cluster.pk] = (key, api)
    if old is not None:
        old[1].close()
    return api


def forget_client(cluster_id: int) -> None:
    with _clients_lock:
        old = _clients.pop(cluster_id, None)
    if old is not None:
        old[1].close()


# --- errors -------------------------------------------------------------------------------------------------------


def status_message(exc: ApiException) -> str:
    """The API server's own message from a Status body, else the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except ValueError:
        pass
    return str(exc.reason or "error")


def error_text(exc: BaseException) -> str:
    """A short, user-facing description of a failed call (no headers, no bodies beyond the Status message)."""
    if isinstance(exc, ApiException):
        if exc.status == 0:
            return f"API server unreachable ({exc.reason})".splitlines()[0][:300]
        return f"{exc.status} {status_message(exc)}"[:500]
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return f"API server unreachable ({type(exc.reason).__name__})"
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError | OSError):
        return f"API server unreachable ({type(exc).__name__})"
    if isinstance(exc, DriverError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"[:500]


# Failed calls by (cluster id, kind), counted in memory (HTTP runs in threads that never touch the ORM) until
# worker.telemetry.api_errors_flush writes them to the database.
_error_counts: Counter = Counter()
_error_lock = threading.Lock()


def error_kind(exc: BaseException) -> str | None:
    """The kind of a failed call for the metrics: unreachable, throttled, conflict, server_error, unauthorized or
    client_error; None for answers that are not failures (404 Not Found, 410 Gone)."""
    if isinstance(exc, ApiException):
        status = exc.status or 0
        if status == 0:
            return "unreachable"
        if status in (404, 410):
            return None
        if status == 429:
            return "throttled"
        if status == 409:
            return "conflict"
        if status in (401, 403):
            return "unauthorized"
        return "server_error" if status >= 500 else "client_error"
    if isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError | OSError):
        return "unreachable"
    return None


def count_error(cluster_id: int | None, exc: BaseException) -> None:
    kind = error_kind(exc)
    if cluster_id is not None and kind is not None:
        with _error_lock:
            _error_counts[(cluster_id, kind)] += 1


def take_error_counts() -> dict[tuple[int, str], int]:
    """The counts since the last call, emptied."""
    with _error_lock:
        counts = dict(_error_counts)
        _error_counts.clear()
    return counts


def is_transient(exc: BaseException) -> bool:
    """Worth another try: conflicts, throttling, server errors, timeouts and broken connections."""
    if isinstance(exc, ApiException):
        return exc.status in RETRY_STATUSES or exc.status == 0
    if isinstance(exc, DriverError):
        return exc.transient
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError | OSError)


def _retry_after(exc: BaseException) -> float:
    headers = getattr(exc, "headers", None) or {}
    try:
        return float(headers.get("Retry-After") or 0)
    except (TypeError, ValueError):
        return 0.0


def with_retries(
    call: Callable[[], object],
    *,
    attempts: int = 8,
    base: float = 0.05,
    cap: float = 2.0,
    retry_if: Callable[[BaseException], bool] = is_transient,
    sleep: Callable[[float], None] = time.sleep,
):
    """Call until it succeeds or fails for good: exponential backoff with full jitter, honouring Retry-After."""
    for attempt in range(attempts):
        try:
            return call()
        except Exception as exc:
            if attempt == attempts - 1 or not retry_if(exc):
                raise
            delay = random.uniform(0, min(cap, base * 2**attempt))
            sleep(min(cap, max(delay, _retry_after(exc))))
    raise AssertionError("unreachable")


# --- calls ----------------------------------------------------------------------------------------------------------


def call(method: Callable, *args, retry_if: Callable[[BaseException], bool] = is_transient, **kwargs) -> bytes:
    """Call a generated API method with retries; returns the raw body, its connection back in the pool.

    Bodies are read raw (`_preload_content=False`): dicts from json.loads, not pydantic models, for 10,000 nodes.
    Every response is read and released, else urllib3 opens (and TLS-handshakes) a new connection per call."""

    cluster_id = getattr(getattr(getattr(method, "__self__", None), "api_client", None), "tessera_cluster_id", None)

    def once():
        try:
            response = method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except Exception as exc:
            count_error(cluster_id, exc)
            raise
        try:
            return response.data
        finally:
            response.release_conn()

    return with_retries(once, retry_if=retry_if)


def read_json(method: Callable, *args, **kwargs) -> dict:
    """Call a generated API method (with retries) and parse its JSON body (the cyclic GC paused: `gc_paused`)."""
    body = call(method, *args, **kwargs)
    with gc_paused():
        return json.loads(body)


_gc_pauses = 0
_gc_lock = threading.Lock()
_gc_resume = False


@contextmanager
def gc_paused():
    """No cyclic garbage collection while parsing a body, in any thread. A page of 1,000 nodes is ~10^5 containers
    built at once: they would outlive the young generations' collections and trigger full collections of the
    worker's whole heap (0.1–0.3 s each on a loaded box, bench/README.md B3). JSON trees hold no reference cycles,
    so pausing the collector loses nothing; refcounting frees them as usual. Leaves a collector someone else
    disabled disabled."""
    global _gc_pauses, _gc_resume
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()


def list_all(method: Callable, *args, limit: int = 500, **kwargs) -> tuple[list[dict], str]:
    """Every item of a paginated list, and the first page's resourceVersion (the consistent point to watch from)."""
    items, token, version = [], None, None
    while True:
        page = read_json(method, *args, limit=limit, _continue=token, **kwargs)
        items.extend(page.get("items") or [])
        if version is None:
            version = page.get("metadata", {}).get("resourceVersion", "")
        token = page.get("metadata", {}).get("continue")
        if not token:
            return items, version or ""


def parallel(
    function: Callable, items: Iterable, *, threads: int = THREADS
) -> list[tuple[object, object, BaseException]]:
    """Run `function(item)` over items in a small thread pool; returns (item, result, error) in input order."""
    items = list(items)
    if not items:
        return []

    def run(item):
        try:
            return item, function(item), None
        except Exception as exc:
            return item, None, exc

    if len(items) == 1:
        return [run(items[0])]
    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="k8s") as pool:
        return list(pool.map(run, items))
