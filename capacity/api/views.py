"""`gpu-hours/`: GPU-hours per day, namespace or team and resource, as JSON or CSV (`?format=csv`)."""

import csv
import io

from drf_spectacular.utils import extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from capacity import selectors
from capacity.api import serializers
from core.roles import Role

CSV_COLUMNS = ("day", "group", "resource", "gpu_hours")


def gpu_hours_csv(rows: list[dict]) -> str:
    """The rows as CSV, one line per day, group and resource (the page's download too)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        writer.writerow([row[c] for c in CSV_COLUMNS])
    return out.getvalue()


class GpuHoursCsvRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return gpu_hours_csv(data["rows"])


class GpuHoursView(APIView):
    """GPU-hours per day (server time zone), group (`group_by`: namespace or team, the pod label set in
    TESSERA["CAPACITY"]["TEAM_LABEL"]) and resource — MIG slices by profile, time-sliced and MPS shares weighted by
    their share — over one pool or all, with how the sum reconciles with the pools' used capacity."""

    action_roles = {None: Role.VIEWER}
    renderer_classes = [*api_settings.DEFAULT_RENDERER_CLASSES, GpuHoursCsvRenderer]

    def finalize_response(self, request, response, *args, **kwargs):
        """Only the GET answer is CSV: an error, or OPTIONS' description, keeps the API's JSON shape (and content
        type) even when CSV was asked for."""
        if request.method != "GET" or response.status_code != 200:
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(parameters=[serializers.GpuHoursQuerySerializer], responses=serializers.GpuHoursSerializer)
    def get(self, request):
        query = serializers.GpuHoursQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        span = {"start": data["from"], "end": data["to"], "pool": data.get("pool")}
        rows = selectors.gpu_hours(group_by=data["group_by"], **span)
        answer = {"rows": rows, "reconciliation": selectors.reconciliation(rows, **span)}
        response = Response(serializers.GpuHoursSerializer(answer).data)
        if request.accepted_renderer.format == "csv":
            response["Content-Disposition"] = f'attachment; filename="gpu-hours-{data["from"]}-{data["to"]}.csv"'
        return response
