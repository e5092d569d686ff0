"""Production: no default secrets, DEBUG refused, secure cookies; fails at start-up when misconfigured."""

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *  # noqa: F403
from config.settings.base import CELERY_BROKER_URL, DATABASES, env

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
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
