"""Beat's periodic tasks run once per period, however many beats and workers run (docs/operations.md#supported-
topology). Two guards, both rows of `PeriodicRun` and so in the one database every process already shares:

- a beat claims (entry, period) before it sends (`claim`, called by core.beat.Scheduler): the unique constraint
  lets the first beat's INSERT in and refuses the others', whose beat then sends nothing for that period;
- the worker that receives the claimed message marks it started (`OncePerPeriod`), so a copy the broker delivers
  again (a worker killed before it acknowledged) finds it started and does nothing.

Why not celery-redbeat (a lock in Redis letting one beat schedule at a time): it adds a dependency and a lease
to tune, and a second beat is only idle standby while its lock is held. Here every beat is active, a dead one costs
nothing (the next beat's claim of the next period goes in), it works on SQLite and PostgreSQL alike, and the rows
are the count of what ran: the record the integration test reads (tests/integration/test_multi_process.py).
"""

import logging
import os
import socket
from datetime import datetime

from celery import Task
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.models import PeriodicRun

log = logging.getLogger(__name__)

HEADER = "tessera_periodic_run"  # the message header carrying the claimed run's id
BEAT_ID = f"{socket.gethostname()}:{os.getpid()}"


def claim(*, name: str, task: str, period_start: datetime, by: str = BEAT_ID) -> int | None:
    """The run of `name` for this period, as the id of the row this beat inserted; None when another beat has it."""
    try:
        with transaction.atomic():
            run = PeriodicRun.objects.create(
                name=name, task=task, period_start=period_start, claimed_at=timezone.now(), claimed_by=by
            )
    except IntegrityError:
        return None
    return run.pk


def start(run_id: int) -> bool:
    """Mark the claimed run started; False when it already was (a second delivery of the same message)."""
    return PeriodicRun.objects.filter(pk=run_id, started_at__isnull=True).update(started_at=timezone.now()) == 1


def finish(run_id: int) -> None:
    PeriodicRun.objects.filter(pk=run_id).update(finished_at=timezone.now())


class OncePerPeriod(Task):
    """Base of beat's periodic tasks: a message beat claimed runs at most once. Sent otherwise (a service asking for
    a reconcile pass now, `celery call`), the task runs as usual."""

    def __call__(self, *args, **kwargs):
        # Read before Task.__call__ pushes a request without headers: a worker's request holds a message's headers as
        # attributes, an eager call (tests) under `headers`.
        run_id = getattr(self.request, HEADER, None) or (self.request.headers or {}).get(HEADER)
        if run_id is None:
            return super().__call__(*args, **kwargs)
        if not start(run_id):
            log.info("%s: periodic run %s already started elsewhere; not running it again", self.name, run_id)
            return None
        result = super().__call__(*args, **kwargs)
        finish(run_id)
        return result
