"""The embedded default for a laptop: DEBUG on, SQLite and the filesystem broker unless told otherwise."""

from config.settings.base import *  # noqa: F403
from config.settings.base import env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
# A development key is fine here; production.py refuses to start without a real one.
SECRET_KEY = env("DJANGO_SECRET_KEY", default="django-insecure-tessera-local-development-only")
