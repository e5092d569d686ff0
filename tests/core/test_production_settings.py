"""Production settings refuse to start misconfigured: each missing piece is named, none falls back to an embedded
default (SQLite, the filesystem broker) that would silently split state between replicas."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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


def _deploy_check(**changes) -> subprocess.CompletedProcess:
    # Without the test run's own DJANGO_ALLOW_ASYNC_UNSAFE (tests/conftest.py), which the checklist rightly refuses.
    left_out = {*GOOD, "CELERY_BROKER_URL", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env = {k: v for k, v in os.environ.items() if k not in left_out}
    env.update({k: v for k, v in {**GOOD, "DJANGO_SECRET_KEY": "k3y-" + "x7Yq" * 14, **changes}.items() if v})
    command = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_production_settings_pass_the_deployment_checklist_without_a_warning():
    result = _deploy_check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_forwarded_proto_is_read_only_behind_a_trusted_proxy():
    code = "import django; django.setup(); from django.conf import settings; print(settings.SECURE_PROXY_SSL_HEADER)"
    env = {k: v for k, v in os.environ.items() if k not in GOOD and k != "CELERY_BROKER_URL"} | GOOD
    for count, expected in (("0", "None"), ("1", "('HTTP_X_FORWARDED_PROTO', 'https')")):
        result = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "TESSERA_TRUSTED_PROXY_COUNT": count},
            capture_output=True,
            text=True,
        )
        assert result.stdout.strip().splitlines()[-1] == expected, result.stderr
