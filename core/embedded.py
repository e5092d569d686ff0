"""What the embedded stack's supervisor (`make run`, console/supervisor.py) says about its parts: read from its status
file for /readyz, /metrics and the overview. Nothing here under production, where the orchestrator restarts."""

import json
import os
import time

from django.conf import settings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from core.health import Check


def status_path():
    return settings.VAR_DIR / "run" / "children.json"


def children_status() -> dict | None:
    """The supervisor's last word on each part (state, restarts, last exit), or None when Tessera does not run under
    `make run` or its supervisor is gone."""
    try:
        status = json.loads(status_path().read_text())
        os.kill(status["supervisor_pid"], 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return status


def _describe(child: dict, now: float) -> str:
    words = {"running": "running", "restarting": "restarting", "given_up": "not restarted any more"}
    text = words.get(child["state"], child["state"])
    if child["restarts"]:
        text += f", restarted {child['restarts']} time{'s' if child['restarts'] != 1 else ''}"
    if child.get("last_exit_at"):
        status = child["last_exit"]
        how = f"signal {-status}" if status is not None and status < 0 else f"status {status}"
        text += f", last exit {how} {int(now - child['last_exit_at'])} s ago"
    return text


def embedded_checks() -> list[Check]:
    """One check per part of `make run`; a part not running fails its check (reported, not required)."""
    status = children_status()
    if status is None:
        return []
    now = time.time()
    return [
        Check(f"embedded:{name}", child["state"] == "running", _describe(child, now))
        for name, child in status["children"].items()
    ]


class EmbeddedCollector:
    """The parts of `make run`: up or not, and how often each was restarted."""

    def collect(self):
        up = GaugeMetricFamily(
            "tessera_embedded_child_up", "1 if this part of `make run` is running.", labels=["child"]
        )
        restarts = CounterMetricFamily(
            "tessera_embedded_child_restarts",
            "Restarts of this part of `make run` by its supervisor.",
            labels=["child"],
        )
        status = children_status()
        for name, child in (status or {}).get("children", {}).items():
            up.add_metric([name], 1 if child["state"] == "running" else 0)
            restarts.add_metric([name], child["restarts"])
        yield from (up, restarts)
