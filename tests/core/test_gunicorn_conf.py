"""gunicorn reads ./gunicorn.conf.py: each worker freezes the application it loaded out of the collector's reach."""

import gc
import runpy
from pathlib import Path

CONF = Path(__file__).resolve().parents[2] / "gunicorn.conf.py"


def test_a_started_worker_freezes_its_loaded_heap():
    hooks = runpy.run_path(str(CONF))
    gc.unfreeze()
    try:
        hooks["post_worker_init"](worker=None)
        assert gc.get_freeze_count() > 10_000  # Django and the project are loaded in a test process
    finally:
        gc.unfreeze()
