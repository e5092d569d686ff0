"""`make run` is no debug server and shares no secret: DEBUG only when asked, a secret key of its own made in var/ on
the first start, var/ and the SQLite file readable by their owner only (issue 15, points 8 and 9)."""

import json
import os
import stat
import subprocess
import sys

from tests.processes import ROOT

READ = (
    "import django; django.setup(); from django.conf import settings as s; print(json.dumps([s.DEBUG, s.SECRET_KEY]))"
)


def local_settings(var_dir, **env) -> tuple[bool, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SECRET_KEY", "DJANGO_DEBUG", "DATABASE_URL")}
    clean |= {"DJANGO_SETTINGS_MODULE": "config.settings.local", "TESSERA_VAR_DIR": str(var_dir), **env}
    out = subprocess.run([sys.executable, "-c", f"import json; {READ}"], cwd=ROOT, env=clean, capture_output=True)
    assert out.returncode == 0, out.stderr.decode()
    return tuple(json.loads(out.stdout.decode().splitlines()[-1]))


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_debug_is_off_and_the_secret_key_is_made_once_in_var(tmp_path):
    var = tmp_path / "var"
    debug, key = local_settings(var)
    assert debug is False and len(key) >= 50 and "insecure" not in key
    assert local_settings(var) == (False, key)  # the same key on the next start
    assert local_settings(tmp_path / "other")[1] != key  # and another install's is another
    assert local_settings(var, DJANGO_DEBUG="true")[0] is True
    assert local_settings(var, DJANGO_SECRET_KEY="from-the-environment")[1] == "from-the-environment"


def test_var_and_the_database_are_private(tmp_path):
    var = tmp_path / "var"
    local_settings(var)
    assert mode(var) == 0o700
    assert mode(var / "secret_key") == 0o600 and mode(var / "tessera.sqlite3") == 0o600


def test_an_earlier_start_s_open_modes_are_tightened(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    (var / "tessera.sqlite3").touch(mode=0o644)
    local_settings(var)
    assert mode(var) == 0o700 and mode(var / "tessera.sqlite3") == 0o600
