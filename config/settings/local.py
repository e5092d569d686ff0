"""The embedded default for a laptop (`make run`): SQLite and the filesystem broker in var/, which only its owner
reads; DEBUG only when asked for (DJANGO_DEBUG=true); a secret key of its own, made in var/ on the first start."""

import os
import tempfile
from pathlib import Path

from django.core.management.utils import get_random_secret_key

from config.settings.base import *  # noqa: F403
from config.settings.base import DATABASES, LOGGING, LOOPBACK, TESSERA, VAR_DIR, env


def _private(path, mode: int) -> None:
    """Tighten what an earlier start made with the umask's mode (only our own files: never someone else's)."""
    if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o777 != mode:
        os.chmod(path, mode)


def _secret_key() -> str:
    """var/secret_key, made once: written to a temporary file, then linked into place, so processes starting
    together all read the one complete key."""
    path = VAR_DIR / "secret_key"
    if not path.exists():
        fd, staged = tempfile.mkstemp(dir=VAR_DIR, prefix=".secret_key.")  # mode 0600
        with os.fdopen(fd, "w") as out:
            out.write(get_random_secret_key() + "\n")
        try:
            os.link(staged, path)
        except FileExistsError:
            pass  # another process won; its key is the key
        finally:
            os.unlink(staged)
    _private(path, 0o600)
    return path.read_text().strip()


VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
_private(VAR_DIR, 0o700)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Created here 0600 before SQLite creates it with the umask's mode; its -wal and -shm files take the same mode.
    os.close(os.open(DATABASES["default"]["NAME"], os.O_WRONLY | os.O_CREAT, 0o600))
    _private(Path(DATABASES["default"]["NAME"]), 0o600)

DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env("DJANGO_SECRET_KEY", default="") or _secret_key()

TESSERA = {
    **TESSERA,
    # `make run` writes the simulator's kubeconfig under var/ and registers its metrics on loopback.
    "KUBECONFIG_DIR": env("TESSERA_KUBECONFIG_DIR", default=str(VAR_DIR)),
    "METRICS_URL_ALLOW": [*TESSERA["METRICS_URL_ALLOW"], *LOOPBACK],
}

# `make run`'s terminal reads as a status: warnings and errors, and the lines of loggers set to INFO in LOGGING (a
# rollout starting or ending); DJANGO_LOG_LEVEL=INFO shows the rest.
LOGGING = {**LOGGING, "root": {**LOGGING["root"], "level": env("DJANGO_LOG_LEVEL", default="WARNING")}}
