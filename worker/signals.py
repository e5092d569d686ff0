"""Reconcile right after a desired-state change commits (the beat tick still catches anything missed)."""

from django.db import transaction
from django.dispatch import receiver

from sharing.signals import desired_state_changed


@receiver(desired_state_changed)
def reconcile_on_commit(sender, **kwargs):
    from worker.tasks import reconcile_tick

    transaction.on_commit(reconcile_tick.delay)
