"""Reads of rollouts: progress counted in the database, for lists without one query per row."""

from django.db import models
from django.db.models import Count, Q

from worker.choices import ChangeStatus


class RolloutQuerySet(models.QuerySet):
    def with_progress(self):
        """Annotate `n_<status>` for every change status (one aggregate query for a whole page)."""
        return self.annotate(
            **{f"n_{status}": Count("changes", filter=Q(changes__status=status)) for status in ChangeStatus.values}
        )
