"""Enumerations of rollouts and node changes."""

from django.db import models


class RolloutStatus(models.TextChoices):
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    SUPERSEDED = "superseded", "Superseded"


class RolloutTrigger(models.TextChoices):
    USER = "user", "User"
    SCHEDULE = "schedule", "Schedule"
    RECONCILE = "reconcile", "Reconcile loop"


class ChangeStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    WAITING_FOR_IDLE = "waiting_for_idle", "Waiting for idle"
    APPLYING = "applying", "Applying"
    VERIFYING = "verifying", "Verifying"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    ROLLED_BACK = "rolled_back", "Rolled back"
    SKIPPED = "skipped", "Skipped"
    CANCELLED = "cancelled", "Cancelled"


LIVE_ROLLOUT_STATUSES = (RolloutStatus.RUNNING, RolloutStatus.PAUSED)
FINISHED_ROLLOUT_STATUSES = (
    RolloutStatus.SUCCEEDED,
    RolloutStatus.FAILED,
    RolloutStatus.CANCELLED,
    RolloutStatus.SUPERSEDED,
)
ACTIVE_CHANGE_STATUSES = (
    ChangeStatus.QUEUED,
    ChangeStatus.WAITING_FOR_IDLE,
    ChangeStatus.APPLYING,
    ChangeStatus.VERIFYING,
)
IN_FLIGHT_STATUSES = (ChangeStatus.WAITING_FOR_IDLE, ChangeStatus.APPLYING, ChangeStatus.VERIFYING)
PROBLEM_STATUSES = (ChangeStatus.FAILED, ChangeStatus.ROLLED_BACK)
TERMINAL_CHANGE_STATUSES = (
    ChangeStatus.SUCCEEDED,
    ChangeStatus.FAILED,
    ChangeStatus.ROLLED_BACK,
    ChangeStatus.SKIPPED,
    ChangeStatus.CANCELLED,
)
