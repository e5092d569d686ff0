"""Celery beat's scheduler (CELERY_BEAT_SCHEDULER): django-celery-beat's database scheduler, with every periodic task
sent once per period however many beats run (core.periodic).

Interval entries fire on the wall clock's multiples of their interval (a 30 s tick at :00 and :30 of each minute),
not 30 s after the beat started: every beat then fires for the same period at the same moment and the claim picks
one. Crontab entries are claimed for their occurrence. Other schedules (solar, clocked) are sent unclaimed.
"""

import math
from datetime import UTC, datetime

from celery import schedules
from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry

from core import periodic


class AlignedInterval(schedules.schedule):
    """Due once per wall-clock period of `run_every` seconds, at its start."""

    def is_due(self, last_run_at: datetime) -> schedules.schedstate:
        period = self.run_every.total_seconds()
        now = self.now().timestamp()
        due = math.floor(now / period) > math.floor(self.maybe_make_aware(last_run_at).timestamp() / period)
        return schedules.schedstate(due, period - now % period)

    def period_start(self) -> datetime:
        period = self.run_every.total_seconds()
        return datetime.fromtimestamp(math.floor(self.now().timestamp() / period) * period, UTC)


class Entry(ModelEntry):
    def __init__(self, model, app=None):
        super().__init__(model, app=app)
        if type(self.schedule) is schedules.schedule:
            self.schedule = AlignedInterval(self.schedule.run_every, app=self.app)


def period_of(entry) -> datetime | None:
    """The period beat sends `entry` for now: its interval's boundary, or its crontab occurrence."""
    schedule = entry.schedule
    if isinstance(schedule, AlignedInterval):
        return schedule.period_start()
    if isinstance(schedule, schedules.crontab):
        last_run_at, delta, _ = schedule.remaining_delta(entry.last_run_at)
        return (last_run_at + delta).astimezone(UTC).replace(microsecond=0)
    return None


class Scheduler(DatabaseScheduler):
    Entry = Entry

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        period = period_of(entry)
        if period is None:
            return super().apply_async(entry, producer, advance, **kwargs)
        run_id = periodic.claim(name=entry.name, task=entry.task, period_start=period)
        if run_id is None:
            periodic.log.info("beat: %s for %s was sent by another beat", entry.name, period.isoformat())
            if advance:
                self.reserve(entry)
            return None
        options = entry.options
        entry.options = {**options, "headers": {**options.get("headers", {}), periodic.HEADER: run_id}}
        try:
            return super().apply_async(entry, producer, advance, **kwargs)
        finally:
            entry.options = options
