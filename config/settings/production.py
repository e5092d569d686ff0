"""Production: no default secrets, DEBUG refused, HTTPS only with secure cookies and HSTS (`manage.py check --deploy`
passes without a warning); fails at start-up when misconfigured."""

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *  # noqa: F403
from config.settings.base import CELERY_BROKER_URL, DATABASES, TESSERA, env

SECRET_KEY = env("DJANGO_SECRET_KEY", default="")
if not SECRET_KEY or SECRET_KEY.startswith("django-insecure"):
    raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set to a real secret in production.")
if env.bool("DJANGO_DEBUG", default=False):
    raise ImproperlyConfigured("DJANGO_DEBUG must be off in production.")
DEBUG = False
if "DATABASE_URL" not in env:
    raise ImproperlyConfigured("DATABASE_URL must be set in production (PostgreSQL).")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    raise ImproperlyConfigured("Production runs on PostgreSQL; SQLite is the embedded default only.")
if CELERY_BROKER_URL.startswith(("filesystem://", "tessera-fs://")):
    # The filesystem broker is the embedded default for one machine; replicas on several hosts would each see their own.
    raise ImproperlyConfigured(
        "REDIS_URL (or CELERY_BROKER_URL) must be set in production; the filesystem broker is embedded only."
    )

SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# HTTPS only: plain HTTP is redirected, except the probes and the Prometheus scrape inside the cluster; browsers are
# told to keep to HTTPS (HSTS; DJANGO_HSTS_SECONDS=0 while trying it out, see Django's deployment checklist).
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_HSTS_PRELOAD", default=True)
# X-Forwarded-Proto says HTTPS only when a trusted proxy wrote it (TESSERA_TRUSTED_PROXY_COUNT > 0, e.g. the ingress
# that terminates TLS); without one a client could write the header itself, so it is not read.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if TESSERA["TRUSTED_PROXY_COUNT"] > 0 else None
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
