"""Fleet endpoints: clusters and pools are managed through the services; nodes, GPUs and MIG devices are read-only
because only observation changes them."""

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from core.api.filters import FilterBackend
from core.audit import Actor
from fleet import selectors, services
from fleet.api import serializers
from fleet.filtersets import ClusterFilterSet, GpuFilterSet, MigDeviceFilterSet, NodeFilterSet, NodePoolFilterSet
from fleet.models import Cluster, Gpu, MigDevice, Node, NodePool


class FleetViewSetMixin:
    """Lists filter, search and order through the FilterSets the HTML lists use too; details find any row."""

    filter_backends = [FilterBackend]

    def filter_queryset(self, queryset):
        # List defaults such as "live rows only" must not hide the row a detail URL names.
        return super().filter_queryset(queryset) if self.action == "list" else queryset

    def reread(self, instance):
        """The row again through the view's queryset, so a write's response carries the annotations of a read."""
        return self.get_queryset().get(pk=instance.pk)


class ClusterViewSet(FleetViewSetMixin, viewsets.ModelViewSet):
    """Clusters: admins register, edit and remove them; every role reads them."""

    # Annotated querysets repeat the model's ordering: Django drops Meta.ordering under GROUP BY.
    queryset = Cluster.objects.with_counts().order_by("name")
    serializer_class = serializers.ClusterSerializer
    filterset_class = ClusterFilterSet

    def perform_create(self, serializer):
        serializer.instance = self.reread(
            services.cluster_create(actor=Actor.from_request(self.request), **serializer.validated_data)
        )

    def perform_update(self, serializer):
        cluster = services.cluster_update(
            actor=Actor.from_request(self.request), cluster=serializer.instance, **serializer.validated_data
        )
        serializer.instance = self.reread(cluster)

    def perform_destroy(self, instance):
        services.cluster_delete(actor=Actor.from_request(self.request), cluster=instance)


class NodePoolViewSet(FleetViewSetMixin, viewsets.ModelViewSet):
    """Node pools: admins manage them and their members; every role reads them."""

    queryset = NodePool.objects.select_related("cluster").with_counts().order_by("cluster__name", "name")
    serializer_class = serializers.NodePoolSerializer
    filterset_class = NodePoolFilterSet

    def perform_create(self, serializer):
        serializer.instance = self.reread(
            services.pool_create(actor=Actor.from_request(self.request), **serializer.validated_data)
        )

    def perform_update(self, serializer):
        pool = services.pool_update(
            actor=Actor.from_request(self.request), pool=serializer.instance, **serializer.validated_data
        )
        serializer.instance = self.reread(pool)

    def perform_destroy(self, instance):
        services.pool_delete(actor=Actor.from_request(self.request), pool=instance)

    @extend_schema(methods=["GET"], responses=serializers.PoolMembersSerializer)
    @extend_schema(
        methods=["POST"], request=serializers.PoolMembersSetSerializer, responses=serializers.PoolMembersSerializer
    )
    @action(detail=True, methods=["get", "post"])
    def members(self, request, pk=None):
        """The pool's live members; POST replaces them with exactly the given nodes."""
        pool = self.get_object()
        if request.method == "POST":
            serializer = serializers.PoolMembersSetSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            services.pool_set_members(
                actor=Actor.from_request(request), pool=pool, nodes=serializer.validated_data["nodes"]
            )
        members = {"nodes": pool.nodes.live().order_by("name")}
        return Response(serializers.PoolMembersSerializer(members, context=self.get_serializer_context()).data)


class NodeViewSet(FleetViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """Nodes as last observed, with a summary of their GPUs."""

    queryset = Node.objects.select_related("cluster", "pool").with_gpu_summary().order_by("cluster__name", "name")
    serializer_class = serializers.NodeSerializer
    filterset_class = NodeFilterSet


class GpuViewSet(FleetViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """GPUs as last observed, with their MIG devices inline."""

    queryset = Gpu.objects.select_related("node__cluster", "node__pool").prefetch_related(
        Prefetch("mig_devices", queryset=MigDevice.objects.order_by("start"))
    )
    serializer_class = serializers.GpuSerializer
    filterset_class = GpuFilterSet

    def list(self, request, *args, **kwargs):
        # Count and page over ids (a count without joins), then read the page as plain rows (bench B1). The same base
        # as the GPU page and the overview (GPUs of nodes that still exist), so their counts agree.
        ids = self.paginate_queryset(self.filter_queryset(selectors.gpu_filter_base()).values_list("pk", flat=True))
        return self.get_paginated_response(serializers.gpu_list_items(ids, request=request))


class MigDeviceViewSet(FleetViewSetMixin, viewsets.ReadOnlyModelViewSet):
    """MIG devices as last observed."""

    queryset = MigDevice.objects.select_related("gpu__node")
    serializer_class = serializers.MigDeviceSerializer
    filterset_class = MigDeviceFilterSet
