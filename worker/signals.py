"""Reconcile right after a desired-state change commits (the beat tick still catches anything missed)."""

from django.dispatch import receiver

from sharing.signals import desired_state_changed
from worker import enqueue


@receiver(desired_state_changed)
def reconcile_on_commit(sender, **kwargs):
    enqueue.reconcile_tick()
