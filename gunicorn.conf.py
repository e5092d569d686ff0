"""gunicorn's settings, read from the working directory by every `gunicorn` command here (the image, the manifests,
Compose and bench B2 all start it from the project's root)."""

import gc


def post_worker_init(worker):
    """Move what the loaded application allocated (~2×10^5 objects: Django, DRF, the URLconf, the models) out of the
    collector's reach, as Celery workers do (config/celery.py): full collections stop rescanning it while requests
    allocate (bench/README.md, B2)."""
    gc.freeze()
