"""Cross-cutting records: the append-only audit log of every desired-state change and rollout transition."""

from django.conf import settings
from django.db import models


class AuditEvent(models.Model):
    """Who changed what, from what to what, and when. Append-only: never updated or deleted by Tessera."""

    class ActorKind(models.TextChoices):
        USER = "user", "User"
        TOKEN = "token", "API token"
        SCHEDULE = "schedule", "Schedule"
        SYSTEM = "system", "Tessera"

    at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    actor_kind = models.CharField(max_length=10, choices=ActorKind.choices)
    actor_label = models.CharField(max_length=200, help_text="Username, schedule name or component, kept if deleted.")
    action = models.CharField(max_length=100, db_index=True, help_text="e.g. profile.create, pool.set_profile")
    object_type = models.CharField(max_length=50, db_index=True)
    object_id = models.CharField(max_length=64, db_index=True)
    object_repr = models.CharField(max_length=300)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["object_type", "object_id", "-at"])]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.object_repr}"


class ApiToken(models.Model):
    """A user's API token, one per user: only the SHA-256 of its secret is stored, so a database dump holds no
    usable token; `key_id` is the public part that finds the row (core/services.py)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    key_id = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: does not expire.")

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self):
        return f"{self.user} ({self.key_id})"


class SsoIdentity(models.Model):
    """The account an OpenID Connect subject signs in to: users are matched by issuer and subject, never by a name
    or an address the provider lets people change (and a provider's `admin` never becomes the local `admin`)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_issuer_subject")]

    def __str__(self):
        return f"{self.user} ({self.subject} at {self.issuer})"


class PeriodicRun(models.Model):
    """One period of one of beat's periodic tasks (core.beat): claimed by the first beat to send it — the unique
    (name, period) refuses every other beat's claim of the same period, so the task is sent once per period however
    many beats run — then started and finished by the worker that runs it (core.periodic), so a redelivered copy
    finds it started and does nothing. Pruned after RETENTION["PERIODIC_RUNS_DAYS"]."""

    name = models.CharField(max_length=200, help_text="Beat's entry, e.g. reconcile-tick.")
    task = models.CharField(max_length=200)
    period_start = models.DateTimeField(help_text="The boundary of the period (interval) or the occurrence (crontab).")
    claimed_at = models.DateTimeField()
    claimed_by = models.CharField(max_length=200, help_text="The beat that sent it: host:pid.")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-period_start", "name"]
        constraints = [models.UniqueConstraint(fields=["name", "period_start"], name="core_periodic_run_once")]

    def __str__(self):
        return f"{self.name} @ {self.period_start:%Y-%m-%d %H:%M:%S}"
