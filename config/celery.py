"""The one Celery app; tasks are discovered from each Django app's tasks.py."""

import gc
import os
from pathlib import Path

from celery import Celery
from celery.signals import worker_process_init, worker_ready
from kombu.transport import TRANSPORT_ALIASES

from core.broker import SCHEME

TRANSPORT_ALIASES.setdefault(SCHEME, "core.broker:Transport")

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("tessera")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def ensure_filesystem_broker_folders() -> None:
    """kombu's filesystem transport needs its folders before anyone sends or consumes (stack-notes)."""
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "processed_folder", "control_folder"):
        if options.get(key):
            Path(options[key]).mkdir(parents=True, exist_ok=True)


if str(app.conf.broker_url).startswith(("filesystem://", f"{SCHEME}://")):
    ensure_filesystem_broker_folders()


@worker_process_init.connect
@worker_ready.connect
def freeze_startup_heap(**_) -> None:
    """Move what the worker holds once started (Django, the kubernetes client, the task modules: ~2×10^5 objects)
    out of the cyclic collector's reach: a full collection then scans only what tasks allocate, not the whole heap
    (0.1–0.3 s a pass on a loaded box, several per 1,000-node rollout step; bench/README.md B3)."""
    gc.freeze()
