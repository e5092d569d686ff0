"""The one Celery app; tasks are discovered from each Django app's tasks.py."""

import os
from pathlib import Path

from celery import Celery
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
