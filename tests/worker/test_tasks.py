"""The worker's tasks as Celery sends them: the reconcile tick's nudges expire instead of piling up."""

import pytest

from worker import tasks
from worker.models import Rollout

pytestmark = pytest.mark.django_db


def test_the_tick_nudges_each_running_rollout_with_a_message_that_expires_by_the_next_tick(monkeypatch):
    running = Rollout.objects.create(title="running", trigger="user", actor_label="test")
    Rollout.objects.create(title="done", trigger="user", actor_label="test", status="succeeded")
    sent = []
    monkeypatch.setattr(tasks.rollout_advance, "apply_async", lambda args, **options: sent.append((args, options)))
    assert tasks.reconcile_tick()["advanced"] == 1
    assert sent == [((running.pk,), {"expires": tasks.RECONCILE_TICK_SECONDS})]
