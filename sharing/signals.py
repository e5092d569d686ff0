"""Sent when desired sharing state changes, so the worker can reconcile at once instead of at the next tick."""

from django.dispatch import Signal

desired_state_changed = Signal()
