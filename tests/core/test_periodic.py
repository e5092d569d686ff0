"""Beat's periodic tasks run once per period however many beats run (core/beat.py, core/periodic.py): interval
entries fire on the wall clock's period boundaries, the first beat's claim of a period wins, and a claimed message
delivered twice runs once. Real beat processes: tests/integration/test_multi_process.py."""

from datetime import UTC, datetime, timedelta

import pytest
from django_celery_beat.models import PeriodicTask

from config.celery import app
from core import periodic
from core.beat import AlignedInterval, Scheduler, period_of
from core.models import PeriodicRun
from worker import tasks
from worker.models import LoopRun
from worker.telemetry import RECONCILE_LOOP

pytestmark = pytest.mark.django_db(transaction=True)  # beat commits and closes its connection as it goes
BOUNDARY = 1_800_000_000  # a multiple of 30 s (epoch seconds)


def _at(seconds: float):
    return lambda: datetime.fromtimestamp(seconds, UTC)


def _runs() -> int:
    return LoopRun.objects.filter(name=RECONCILE_LOOP).values_list("runs", flat=True).first() or 0


def test_an_interval_is_due_at_each_wall_clock_boundary_not_an_interval_after_its_last_run():
    last = datetime.fromtimestamp(BOUNDARY + 0.2, UTC)
    before = AlignedInterval(timedelta(seconds=30), nowfun=_at(BOUNDARY + 29.9))
    assert before.is_due(last) == (False, pytest.approx(0.1))
    after = AlignedInterval(timedelta(seconds=30), nowfun=_at(BOUNDARY + 30.05))
    assert after.is_due(last) == (True, pytest.approx(29.95))
    assert after.period_start() == datetime.fromtimestamp(BOUNDARY + 30, UTC)


def test_two_beats_send_a_tick_once_per_period_and_a_second_delivery_does_not_run_it():
    beats = [Scheduler(app=app), Scheduler(app=app)]
    entries = [beat.schedule["reconcile-tick"] for beat in beats]
    assert all(isinstance(entry.schedule, AlignedInterval) for entry in entries)
    for beat, entry in zip(beats, entries, strict=True):
        beat.apply_async(entry, advance=False)  # eager in tests: the tick runs here, as a worker would run it
    (run,) = PeriodicRun.objects.all()
    assert (run.name, run.task) == ("reconcile-tick", "worker.tasks.reconcile_tick")
    assert run.claimed_by == periodic.BEAT_ID and run.started_at and run.finished_at
    assert _runs() == 1

    assert tasks.reconcile_tick.apply(headers={periodic.HEADER: run.pk}).result is None  # delivered again
    assert _runs() == 1
    tasks.reconcile_tick.apply()  # asked for by a service (desired state changed): not a period's tick
    assert _runs() == 2


def test_both_beats_claim_a_crontab_entry_for_the_same_occurrence():
    beats = [Scheduler(app=app), Scheduler(app=app)]  # each loads its entries from the database
    # django-celery-beat loads a crontab entry only in the hours around its own: read as each beat reads it then.
    periods = {
        period_of(beat.Entry(PeriodicTask.objects.get(name="worker-retention-prune"), app=app)) for beat in beats
    }
    (period,) = periods
    assert (period.hour, period.minute, period.second) == (3, 5, 0)
    assert periodic.claim(name="worker-retention-prune", task="t", period_start=period) is not None
    assert periodic.claim(name="worker-retention-prune", task="t", period_start=period, by="other:1") is None


def test_every_task_beat_sends_runs_once_per_period(settings):
    """A beat entry whose task lacks the OncePerPeriod base would run once per beat: two beats, twice."""
    app.loader.import_default_modules()
    tasks_of_beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"worker.tasks.reconcile_tick", "capacity.tasks.sample"} <= tasks_of_beat
    missing = sorted(name for name in tasks_of_beat if not isinstance(app.tasks[name], periodic.OncePerPeriod))
    assert not missing, f"beat's tasks without base=OncePerPeriod: {missing}"
