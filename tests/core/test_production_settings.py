"""Production settings refuse to start misconfigured: each missing piece is named, none falls back to an embedded
default (SQLite, the filesystem broker) that would silently split state between replicas."""

import os
import subprocess
import sys

import pytest

GOOD = {
    "DJANGO_SETTINGS_MODULE": "config.settings.production",
    "DJANGO_SECRET_KEY": "x" * 50,
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/tessera",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
}


def _load(**changes) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in GOOD and k != "CELERY_BROKER_URL"}
    env.update({k: v for k, v in {**GOOD, **changes}.items() if v is not None})
    code = "import django; django.setup(); from django.conf import settings; print(settings.CELERY_BROKER_URL)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_production_settings_load_when_complete():
    result = _load()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"DJANGO_SECRET_KEY": None}, "DJANGO_SECRET_KEY must be set"),
        ({"DATABASE_URL": None}, "DATABASE_URL must be set"),
        ({"DATABASE_URL": "sqlite:////tmp/x.sqlite3"}, "Production runs on PostgreSQL"),
        ({"REDIS_URL": None}, "REDIS_URL (or CELERY_BROKER_URL) must be set"),
        ({"DJANGO_DEBUG": "true"}, "DJANGO_DEBUG must be off"),
    ],
)
def test_production_settings_refuse_what_is_missing(changes, message):
    result = _load(**changes)
    assert result.returncode != 0
    assert message in result.stderr
