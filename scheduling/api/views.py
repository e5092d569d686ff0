"""Schedule endpoints: CRUD and the day/night preset (admins), transitions of one schedule and of the fleet; a
profile's preview and assignment, which weigh the pool's schedule."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from core.audit import Actor
from core.roles import Role
from fleet.filtersets import NodeFilterSet
from fleet.models import Node
from scheduling import selectors, services
from scheduling.api import serializers
from scheduling.assign import schedule_rule
from scheduling.models import Schedule
from sharing import selectors as sharing_selectors
from sharing.api import serializers as sharing_serializers
from sharing.models import SharingProfile


def _rows(data: dict) -> dict:
    """Nested serializer output → keyword arguments for the services."""
    values = dict(data)
    values.pop("pool", None)
    values.pop("dry_run", None)
    if "windows" in values:
        values["windows"] = [dict(w) for w in values["windows"]]
    if "exceptions" in values:
        values["exceptions"] = [dict(e) for e in values["exceptions"]]
    return values


DRY_RUN = OpenApiParameter(
    "dry_run", bool, description="true: answer what saving would do, write nothing (same as the body's `dry_run`)"
)


# An update answers the schedule saved, or with `dry_run` what saving would do: either body, never both.
SAVED_OR_DRY_RUN = PolymorphicProxySerializer(
    component_name="ScheduleOrDryRun",
    serializers=[serializers.ScheduleSerializer, serializers.DryRunSerializer],
    resource_type_field_name=None,
)


def _dry_run(request, data: dict) -> bool:
    """`dry_run` in the body, or `?dry_run=true` (1, yes, on) in the query string."""
    query = request.query_params.get("dry_run", "").strip().lower() in ("true", "1", "yes", "on")
    return bool(data.get("dry_run")) or query


def _impact(request, changes) -> Response:
    body = {"dry_run": True, "impact": changes}
    return Response(serializers.DryRunSerializer(body, context={"request": request}).data)


class ScheduleViewSet(viewsets.ModelViewSet):
    """Schedules per pool; NVIDIA and calendar rules checked by the services with a message per field."""

    queryset = Schedule.objects.select_related("pool", "baseline_profile").prefetch_related(
        "windows__profile", "exceptions"
    )
    serializer_class = serializers.ScheduleSerializer
    filterset_fields = ["pool", "enabled"]
    search_fields = ["name"]

    @extend_schema(
        parameters=[DRY_RUN],
        responses={201: serializers.ScheduleSerializer, 200: serializers.DryRunSerializer},
        description="With `dry_run`: 200 and what saving would do; nothing is written.",
    )
    def create(self, request, *args, **kwargs):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not _dry_run(request, body.validated_data):
            return super().create(request, *args, **kwargs)
        data = body.validated_data
        return _impact(request, services.schedule_create_preview(pool=data["pool"], **_rows(data)))

    @extend_schema(
        parameters=[DRY_RUN],
        responses={200: SAVED_OR_DRY_RUN},
        description="With `dry_run`: what saving would do (a DryRun body); nothing is written.",
    )
    def update(self, request, *args, **kwargs):
        partial = kwargs.get("partial", False)
        body = self.get_serializer(self.get_object(), data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        if not _dry_run(request, body.validated_data):
            return super().update(request, *args, **kwargs)
        return _impact(request, services.schedule_update_preview(schedule=body.instance, **_rows(body.validated_data)))

    @extend_schema(
        parameters=[DRY_RUN],
        responses={200: SAVED_OR_DRY_RUN},
        description="With `dry_run`: what saving would do (a DryRun body); nothing is written.",
    )
    def partial_update(self, request, *args, **kwargs):
        return super().partial_update(request, *args, **kwargs)

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

    @extend_schema(
        request=serializers.DayNightSerializer,
        parameters=[DRY_RUN],
        responses={201: serializers.ScheduleSerializer, 200: serializers.DryRunSerializer},
    )
    @action(detail=False, methods=["post"], url_path="day-night")
    def day_night(self, request):
        """Create the day/night preset for a pool: a plain schedule with one weekday window. With `dry_run`: 200
        and what creating it would do; nothing is written."""
        body = serializers.DayNightSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        preset = dict(body.validated_data)
        if _dry_run(request, preset):
            preset.pop("dry_run")
            return _impact(request, services.schedule_create_day_night_preview(**preset))
        preset.pop("dry_run")
        schedule = services.schedule_create_day_night(actor=Actor.from_request(request), **preset)
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


class ProfilePreviewView(APIView):
    """`profiles/{id}/preview/`: what applying the profile would do, per node (resources before → after, resets,
    pods that lose a slice), and for a pool whose schedule sets its profile now, what that schedule will do."""

    action_roles = {None: Role.VIEWER}

    @extend_schema(request=sharing_serializers.PreviewRequestSerializer, responses=serializers.PreviewSerializer)
    def post(self, request, pk):
        profile = get_object_or_404(SharingProfile, pk=pk)
        body = sharing_serializers.PreviewRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        pool = body.validated_data.get("pool")
        nodes = pool.nodes.live() if pool else Node.objects.filter(pk__in=[n.pk for n in body.validated_data["nodes"]])
        impacts = sharing_selectors.profile_preview(profile, nodes)
        data = {
            "summary": sharing_selectors.preview_summary(impacts),
            "nodes": impacts,
            "schedule": schedule_rule(pool) if pool else None,
        }
        return Response(serializers.PreviewSerializer(data, context={"request": request}).data)
