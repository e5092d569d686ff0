"""Shared by the benchmarks: Django on a scratch database, medians, and the one line format for results."""

import os
import statistics
import time


def setup_django(scratch_dir: str, name: str):
    """Django on a scratch database: a SQLite file in `scratch_dir`, or a scratch database beside DATABASE_URL's."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django
    from django.conf import settings

    django.setup()
    from django.db import connection

    settings.DEBUG = False  # DEBUG would keep every query in memory
    if connection.vendor == "sqlite" and not os.environ.get("DATABASE_URL"):
        connection.settings_dict["TEST"]["NAME"] = os.path.join(scratch_dir, f"{name}.sqlite3")
    else:
        # TESSERA_BENCH_DB: another name, so that two runs of one benchmark on one server never share a database.
        connection.settings_dict["TEST"]["NAME"] = os.environ.get("TESSERA_BENCH_DB", f"tessera_bench_{name}")
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    return connection, old_name


def median_seconds(fn, runs: int, warmup: int = 2) -> float:
    """Median wall time of `fn()` over `runs` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"
