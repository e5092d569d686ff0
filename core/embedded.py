"""What the embedded stack's supervisor (`make run`) says about its parts, for `/readyz` and the overview."""

import json
import os
import time

from django.conf import settings


def status_path():
    return settings.VAR_DIR / "run" / "children.json"


def children_status() -> dict | None:
    """The supervisor's last word on each part (state, restarts, last exit), or None when Tessera does not run under
    `make run` (production: the orchestrator restarts processes) or the supervisor is gone."""
    try:
        status = json.loads(status_path().read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(status["supervisor_pid"], 0)
    except (OSError, KeyError, TypeError):
        return None
    status["age_seconds"] = time.time() - status.get("updated_at", 0)
    return status
