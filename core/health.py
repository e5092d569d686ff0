"""Readiness checks behind /readyz: each dependency says whether it works and, in words, what it saw.

core checks the database and the broker; the apps above add theirs from AppConfig.ready() (worker: each cluster's
watch, beat's reconcile tick). A failed check whose name is in TESSERA["READYZ_REQUIRED"] (default: the database)
makes /readyz answer 503 so a load balancer stops sending requests; the others are reported, not enforced: a web
process without beat or a cluster watch still serves every page, and taking it out would not bring them back.
"""

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from core import queue_stats


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


_PROVIDERS: dict[str, Callable[[], Iterable[Check]]] = {}


def register(name: str, provider: Callable[[], Iterable[Check]]) -> None:
    """Add a source of checks (a function returning Check values); the same name replaces."""
    _PROVIDERS[name] = provider


def run_checks() -> list[Check]:
    """Every registered check; a provider that raises becomes one failed check carrying its error."""
    checks = []
    for name, provider in _PROVIDERS.items():
        try:
            checks.extend(provider())
        except Exception as exc:
            checks.append(Check(name, False, f"the check itself failed: {type(exc).__name__}: {exc}"))
    return checks


def required(check: Check) -> bool:
    names = settings.TESSERA.get("READYZ_REQUIRED", ("database",))
    return any(check.name == n or check.name.startswith(n + ":") for n in names)


def database_checks() -> list[Check]:
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        return [Check("database", False, f"{connection.vendor}: {exc}")]
    return [Check("database", True, f"{connection.vendor} answered in {1000 * (time.perf_counter() - started):.0f} ms")]


def broker_checks() -> list[Check]:
    started = time.perf_counter()
    try:
        transport = queue_stats.ping()
    except Exception as exc:
        return [Check("broker", False, f"unreachable: {type(exc).__name__}: {exc}"[:300])]
    return [Check("broker", True, f"{transport} answered in {1000 * (time.perf_counter() - started):.0f} ms")]
