"""Filters for rollouts and node changes, shared by the HTML lists and the API."""

import django_filters

from worker.choices import ChangeStatus, RolloutStatus, RolloutTrigger
from worker.models import NodeChange, Rollout


class RolloutFilterSet(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=RolloutStatus.choices)
    trigger = django_filters.ChoiceFilter(choices=RolloutTrigger.choices)
    active = django_filters.BooleanFilter(method="filter_active", label="Running or paused")

    class Meta:
        model = Rollout
        fields = ["status", "trigger", "pool", "profile"]

    def filter_active(self, queryset, name, value):
        active = [RolloutStatus.RUNNING, RolloutStatus.PAUSED]
        return queryset.filter(status__in=active) if value else queryset.exclude(status__in=active)


class NodeChangeFilterSet(django_filters.FilterSet):
    status = django_filters.MultipleChoiceFilter(choices=ChangeStatus.choices)

    class Meta:
        model = NodeChange
        fields = ["status", "rollout", "node"]
