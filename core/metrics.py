"""The Prometheus registry served at /metrics. Each app registers its collectors here from AppConfig.ready(); a
collector reads the database at scrape time, so every web process (gunicorn workers, replicas) answers the same
and nothing is lost when a process restarts. One failing collector leaves the others' series in the scrape and
says so in `tessera_scrape_collector_success`."""

import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from core.queue_stats import queue_stats

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=False)
_SCRAPE_MEMO: ContextVar[dict | None] = ContextVar("tessera_scrape_memo", default=None)


def once_per_scrape(key: str, compute: Callable[[], object]):
    """`compute()` once per scrape, shared by the collectors that need it (outside a scrape: every call)."""
    memo = _SCRAPE_MEMO.get()
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


class AppCollectors:
    """Every app's collector by name, run one after the other with its time and success reported."""

    def __init__(self):
        self.collectors: dict[str, object] = {}

    def collect(self):
        seconds = GaugeMetricFamily(
            "tessera_scrape_collector_duration_seconds",
            "Time each collector took in this scrape.",
            labels=["collector"],
        )
        success = GaugeMetricFamily(
            "tessera_scrape_collector_success", "1 if the collector's series are in this scrape.", labels=["collector"]
        )
        token = _SCRAPE_MEMO.set({})
        try:
            families = list(self._collect_all(seconds, success))
        finally:
            _SCRAPE_MEMO.reset(token)
        yield from families
        yield seconds
        yield success

    def _collect_all(self, seconds, success):
        for name, collector in self.collectors.items():
            started = time.perf_counter()
            try:
                families = list(collector.collect())
            except Exception:
                log.exception("metrics collector %s failed", name)
                families, ok = [], 0
            else:
                ok = 1
            yield from families
            seconds.add_metric([name], time.perf_counter() - started)
            success.add_metric([name], ok)


_APP_COLLECTORS = AppCollectors()
REGISTRY.register(_APP_COLLECTORS)


def register(name: str, collector) -> None:
    """Add an app's collector (an object with `collect()` yielding metric families); the same name replaces."""
    _APP_COLLECTORS.collectors[name] = collector


def timestamp(value: datetime | None) -> float | None:
    """Seconds since the epoch, Prometheus' unit for instants."""
    return value.timestamp() if value is not None else None


def age_seconds(value: datetime | None, now: datetime) -> float | None:
    return max(0.0, (now - value).total_seconds()) if value is not None else None


class BrokerCollector:
    """The Celery broker: reachable, and each queue's depth and oldest task age (read from the broker itself, so
    every worker's backlog is seen, whichever process serves the scrape)."""

    def collect(self):
        up = GaugeMetricFamily("tessera_broker_up", "1 if the Celery broker answered this scrape.")
        depth = GaugeMetricFamily("tessera_celery_queue_length", "Tasks waiting in the queue.", labels=["queue"])
        age = GaugeMetricFamily(
            "tessera_celery_queue_oldest_task_age_seconds",
            "Age of the oldest task waiting in the queue (absent where the transport keeps no send time).",
            labels=["queue"],
        )
        try:
            stats = queue_stats()
        except Exception as exc:
            log.warning("the broker did not answer the metrics scrape: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        for queue in stats:
            depth.add_metric([queue.queue], queue.depth)
            if queue.oldest_age_seconds is not None:
                age.add_metric([queue.queue], queue.oldest_age_seconds)
        yield from (up, depth, age)
