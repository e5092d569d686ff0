"""Schedule endpoints: CRUD and the day/night preset (admins), transitions of one schedule and of the fleet."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from core.audit import Actor
from fleet.filtersets import NodeFilterSet
from fleet.models import Node
from scheduling import selectors, services
from scheduling.api import serializers
from scheduling.models import Schedule


def _rows(data: dict) -> dict:
    """Nested serializer output → keyword arguments for the services."""
    values = dict(data)
    values.pop("pool", None)
    if "windows" in values:
        values["windows"] = [dict(w) for w in values["windows"]]
    if "exceptions" in values:
        values["exceptions"] = [dict(e) for e in values["exceptions"]]
    return values


class ScheduleViewSet(viewsets.ModelViewSet):
    """Schedules per pool; NVIDIA and calendar rules checked by the services with a message per field."""

    queryset = Schedule.objects.select_related("pool", "baseline_profile").prefetch_related(
        "windows__profile", "exceptions"
    )
    serializer_class = serializers.ScheduleSerializer
    filterset_fields = ["pool", "enabled"]
    search_fields = ["name"]

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.schedule_create(
            actor=Actor.from_request(self.request), pool=data["pool"], **_rows(data)
        )

    def perform_update(self, serializer):
        serializer.instance = services.schedule_update(
            actor=Actor.from_request(self.request), schedule=serializer.instance, **_rows(serializer.validated_data)
        )

    def perform_destroy(self, instance):
        services.schedule_delete(actor=Actor.from_request(self.request), schedule=instance)

    @extend_schema(request=serializers.DayNightSerializer, responses=serializers.ScheduleSerializer)
    @action(detail=False, methods=["post"], url_path="day-night")
    def day_night(self, request):
        """Create the day/night preset for a pool: a plain schedule with one weekday window."""
        body = serializers.DayNightSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        schedule = services.schedule_create_day_night(actor=Actor.from_request(request), **body.validated_data)
        return Response(self.get_serializer(schedule).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[serializers.TransitionRangeSerializer], responses=serializers.TransitionSerializer(many=True)
    )
    @action(detail=True, methods=["get"])
    def transitions(self, request, pk=None):
        """When this schedule switches profiles between `start` and `end` (default: the next 7 days), paged."""
        query = serializers.TransitionRangeSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        start, end = query.validated_data["start"], query.validated_data["end"]
        # Paged like every list of a resource (the schema says so); /transitions/ is the fleet's short outlook.
        page = self.paginate_queryset(selectors.schedule_transitions(self.get_object(), start, end))
        return self.get_paginated_response(
            serializers.TransitionSerializer(page, many=True, context=self.get_serializer_context()).data
        )


class UpcomingTransitionsView(APIView):
    """The fleet's schedule changes in the next hours, with the number of nodes each switches."""

    @extend_schema(parameters=[serializers.UpcomingSerializer], responses=serializers.TransitionSerializer(many=True))
    def get(self, request):
        query = serializers.UpcomingSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        items = selectors.upcoming_transitions(hours=query.validated_data["hours"])
        return Response(serializers.TransitionSerializer(items, many=True, context={"request": request}).data)


class DesiredStateViewSet(viewsets.GenericViewSet, mixins.ListModelMixin):
    """Per node: the desired profile and configs beside the observed ones; `in_sync` false marks drift."""

    serializer_class = serializers.DesiredStateSerializer
    filterset_class = NodeFilterSet

    def get_queryset(self):
        return Node.objects.live().select_related("cluster", "pool").order_by("cluster__name", "name")

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        rows = selectors.desired_vs_observed(page)
        return self.get_paginated_response(self.get_serializer(rows, many=True).data)
