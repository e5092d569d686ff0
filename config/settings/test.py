"""Settings for pytest: fast hashing, tasks run in-process unless a test starts a real worker."""

import os
import tempfile
from pathlib import Path

from config.settings.base import *  # noqa: F403
from config.settings.base import DATABASES, LOOPBACK, TESSERA, env

SECRET_KEY = "tessera-test-secret-key-not-for-production"
DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ALLOWED_HOSTS = ["*"]
CELERY_TASK_ALWAYS_EAGER = env.bool("TESSERA_TEST_EAGER", default=True)
CELERY_TASK_EAGER_PROPAGATES = True
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
TESSERA = {
    **TESSERA,
    "STALE_AFTER_SECONDS": 180,
    # pytest writes agent reports at once (no flush thread: a test that buffers flushes itself); the web servers that
    # integration tests start buffer as in production (tests/processes.py).
    "AGENT_REPORT_FLUSH_SECONDS": env.float("TESSERA_AGENT_REPORT_FLUSH_SECONDS", default=0),
    # No report cache in pytest: a test's transaction never commits, so no change would be notified
    # (tests/agents/test_report_cache.py turns it on over committed transactions).
    "AGENT_REPORT_CACHE_SECONDS": env.float("TESSERA_AGENT_REPORT_CACHE_SECONDS", default=0),
    # The simulator and pytest write kubeconfigs into temporary directories and serve metrics on loopback.
    "KUBECONFIG_DIR": tempfile.gettempdir(),
    "METRICS_URL_ALLOW": [*TESSERA["METRICS_URL_ALLOW"], *LOOPBACK],
}
WHITENOISE_AUTOREFRESH = True  # serve from the finders; tests never run collectstatic
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so a real worker process started by a test sees the same test database;
    # one per pytest process, so parallel runs never share it.
    DATABASES["default"]["TEST"] = {"NAME": str(Path(tempfile.gettempdir()) / f"tessera-pytest-{os.getpid()}.sqlite3")}
