"""The embedded default for a laptop: DEBUG on, SQLite and the filesystem broker unless told otherwise."""

from config.settings.base import *  # noqa: F403
from config.settings.base import LOOPBACK, TESSERA, VAR_DIR, env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
# A development key is fine here; production.py refuses to start without a real one.
SECRET_KEY = env("DJANGO_SECRET_KEY", default="django-insecure-tessera-local-development-only")

TESSERA = {
    **TESSERA,
    # `make run` writes the simulator's kubeconfig under var/ and registers its metrics on loopback.
    "KUBECONFIG_DIR": env("TESSERA_KUBECONFIG_DIR", default=str(VAR_DIR)),
    "METRICS_URL_ALLOW": [*TESSERA["METRICS_URL_ALLOW"], *LOOPBACK],
}
