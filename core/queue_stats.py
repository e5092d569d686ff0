"""What the Celery broker holds, read without consuming: is it reachable, how many tasks wait in a queue and how old
the oldest is. For /readyz and /metrics, from any process (nothing here lives in the process that sent the tasks).

Ages: a task sent through Redis carries the wall-clock time it was sent (`stamp_sent_at`, connected to Celery's
before_task_publish in core.apps); the filesystem broker's message files have their write time. Other transports
(memory://, tests) report the depth their channel gives, and no age.
"""

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from celery import current_app

from core.broker import SCHEME

SENT_AT_HEADER = "tessera_sent_at"
TIMEOUT_SECONDS = 2.0


def stamp_sent_at(headers=None, **kwargs) -> None:
    """before_task_publish receiver: the send time, so the queue's oldest task has an age anyone can read."""
    if headers is not None:
        headers.setdefault(SENT_AT_HEADER, time.time())


@dataclass(frozen=True)
class QueueStats:
    queue: str
    depth: int
    oldest_age_seconds: float | None


def queue_names() -> list[str]:
    """The queues Tessera's tasks go to (all to the default queue unless routes say otherwise)."""
    conf = current_app.conf
    names = {conf.task_default_queue}
    for route in (conf.task_routes or {}).values() if isinstance(conf.task_routes, dict) else ():
        if isinstance(route, dict) and route.get("queue"):
            names.add(route["queue"])
    return sorted(names)


def _connection():
    return current_app.connection_for_read(
        connect_timeout=TIMEOUT_SECONDS,
        transport_options={
            **(current_app.conf.broker_transport_options or {}),
            "socket_timeout": TIMEOUT_SECONDS,
            "socket_connect_timeout": TIMEOUT_SECONDS,
        },
    )


def ping() -> str:
    """Raise if the broker cannot be reached; else its transport's name (redis, filesystem...)."""
    with _connection() as connection:
        connection.ensure_connection(max_retries=1, timeout=TIMEOUT_SECONDS)
        if connection.transport_cls in ("filesystem", SCHEME):
            folder = (current_app.conf.broker_transport_options or {}).get("data_folder_in", "")
            if not os.path.isdir(folder):
                raise OSError(f"the broker folder {folder} does not exist")
        elif hasattr(connection.default_channel, "client") and hasattr(connection.default_channel.client, "ping"):
            connection.default_channel.client.ping()
        return connection.transport_cls


def queue_stats(now: float | None = None) -> list[QueueStats]:
    """Depth and oldest task age of every queue; raises if the broker cannot be reached."""
    now = now or time.time()
    names = queue_names()
    with _connection() as connection:
        connection.ensure_connection(max_retries=1, timeout=TIMEOUT_SECONDS)
        if connection.transport_cls in ("filesystem", SCHEME):
            return [_filesystem_stats(name, now) for name in names]
        channel = connection.default_channel
        client = getattr(channel, "client", None)
        if connection.transport_cls in ("redis", "rediss") and client is not None:
            return [_redis_stats(client, name, now) for name in names]
        return [QueueStats(name, _declared_depth(channel, name), None) for name in names]


def _filesystem_stats(queue: str, now: float) -> QueueStats:
    folder = Path((current_app.conf.broker_transport_options or {}).get("data_folder_in", ""))
    suffix = f".{queue}.msg"
    depth, oldest = 0, None
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.endswith(suffix):
                depth += 1
                try:
                    written = entry.stat().st_mtime
                except FileNotFoundError:  # consumed meanwhile
                    continue
                oldest = written if oldest is None else min(oldest, written)
    return QueueStats(queue, depth, max(0.0, now - oldest) if oldest is not None else None)


def _redis_stats(client, queue: str, now: float) -> QueueStats:
    depth = int(client.llen(queue))
    oldest = client.lindex(queue, -1) if depth else None  # kombu pushes on the left and pops on the right
    age = None
    if oldest:
        try:
            sent = json.loads(oldest).get("headers", {}).get(SENT_AT_HEADER)
            age = max(0.0, now - float(sent)) if sent is not None else None
        except (ValueError, TypeError, AttributeError):
            age = None
    return QueueStats(queue, depth, age)


def _declared_depth(channel, queue: str) -> int:
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except Exception:  # an undeclared queue holds nothing
        return 0
