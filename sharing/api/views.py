"""Sharing endpoints: profiles (admin), their preview (any role), pins (operators), the MIG catalog. Assigning a
profile to a pool is routed to worker.api, since it may start a rollout."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from core.audit import Actor
from core.roles import Role
from sharing import services
from sharing.api import serializers
from sharing.mig import PRODUCTS, validate_layout
from sharing.models import NodePin, QoSComplianceReport, QoSPolicy, SharingProfile


class SharingProfileViewSet(viewsets.ModelViewSet):
    """Sharing profiles; NVIDIA's rules are checked by the services, with a message per field."""

    queryset = SharingProfile.objects.all()
    serializer_class = serializers.SharingProfileSerializer
    search_fields = ["name", "description"]
    ordering_fields = ["name", "mode", "updated_at"]
    filterset_fields = ["mode"]
    # preview/ weighs the pool's schedule (scheduling/api/views.py); assign/ may start a rollout (worker/api/views.py).
    action_roles = {"pin": Role.OPERATOR}

    def perform_create(self, serializer):
        serializer.instance = services.profile_create(
            actor=Actor.from_request(self.request), **serializer.validated_data
        )

    def perform_update(self, serializer):
        serializer.instance = services.profile_update(
            actor=Actor.from_request(self.request), profile=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        services.profile_delete(actor=Actor.from_request(self.request), profile=instance)

    @extend_schema(request=serializers.PinRequestSerializer, responses=serializers.NodePinSerializer(many=True))
    @action(detail=True, methods=["post"])
    def pin(self, request, pk=None):
        """Pin nodes to this profile, overriding their pool and schedule (until `until`, when given)."""
        profile = self.get_object()
        body = serializers.PinRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        actor = Actor.from_request(request)
        reason, until = body.validated_data.get("reason", ""), body.validated_data.get("until")
        pins = services.nodes_pin_profile(
            actor=actor, nodes=body.validated_data["nodes"], profile=profile, reason=reason, until=until
        )
        return Response(serializers.NodePinSerializer(pins, many=True, context=self.get_serializer_context()).data)


class NodePinViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Node pins; deleting one returns the node to its pool's profile."""

    queryset = NodePin.objects.select_related("node", "profile").order_by("node__name")
    serializer_class = serializers.NodePinSerializer
    filterset_fields = ["profile", "node"]
    write_role = Role.OPERATOR

    def perform_destroy(self, instance):
        services.node_unpin(actor=Actor.from_request(self.request), node=instance.node)


class MigValidateView(APIView):
    """Live validation of a MIG layout for a GPU product: 200 with valid/placements or valid=false and reasons."""

    action_roles = {None: Role.VIEWER}

    @extend_schema(request=serializers.MigValidateSerializer, responses=serializers.MigValidateResultSerializer)
    def post(self, request):
        body = serializers.MigValidateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        result = validate_layout(body.validated_data["product"], body.validated_data["devices"])
        if not result.valid:
            return Response({"valid": False, "errors": list(result.errors)}, status=status.HTTP_200_OK)
        return Response(
            {
                "valid": True,
                "placements": [{"profile": p.profile, "start": p.start, "size": p.size} for p in result.placements],
                "compute_slices_used": result.compute_slices_used,
                "memory_slices_used": result.memory_slices_used,
            }
        )


class MigProductsView(APIView):
    """The MIG catalog: every GPU product Tessera knows, with its MIG profiles and placements."""

    @extend_schema(responses=serializers.GpuProductSerializer(many=True))
    def get(self, request):
        products = sorted(PRODUCTS.values(), key=lambda p: p.name)
        return Response(serializers.GpuProductSerializer(products, many=True).data)


class QoSPolicyViewSet(viewsets.ModelViewSet):
    """QoS policies (admins write); attaching one to a pool is an operator's move, checked for consistency."""

    queryset = QoSPolicy.objects.all()
    serializer_class = serializers.QoSPolicySerializer
    search_fields = ["name", "description"]
    ordering_fields = ["name", "updated_at"]
    action_roles = {"attach": Role.OPERATOR, "detach": Role.OPERATOR}

    def perform_create(self, serializer):
        serializer.instance = services.qos_policy_create(
            actor=Actor.from_request(self.request), **serializer.validated_data
        )

    def perform_update(self, serializer):
        serializer.instance = services.qos_policy_update(
            actor=Actor.from_request(self.request), policy=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance):
        services.qos_policy_delete(actor=Actor.from_request(self.request), policy=instance)

    @extend_schema(request=serializers.QoSAttachSerializer, responses=serializers.QoSPolicySerializer)
    @action(detail=True, methods=["post"])
    def attach(self, request, pk=None):
        """Make this the default QoS policy of a pool."""
        policy = self.get_object()
        body = serializers.QoSAttachSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.pool_set_qos_policy(actor=Actor.from_request(request), pool=body.validated_data["pool"], policy=policy)
        return Response(self.get_serializer(policy).data)

    @extend_schema(request=serializers.QoSAttachSerializer, responses=serializers.QoSPolicySerializer)
    @action(detail=True, methods=["post"])
    def detach(self, request, pk=None):
        """Remove the pool's default QoS policy (if it is this one)."""
        policy = self.get_object()
        body = serializers.QoSAttachSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        pool = body.validated_data["pool"]
        if getattr(getattr(pool, "sharing", None), "qos_policy_id", None) == policy.pk:
            services.pool_set_qos_policy(actor=Actor.from_request(request), pool=pool, policy=None)
        return Response(self.get_serializer(policy).data)


class QoSComplianceViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The last compliance report of each pool: pods breaking their pool's QoS rules, kubelet mismatches."""

    queryset = QoSComplianceReport.objects.select_related("pool", "policy").order_by("pool__name")
    serializer_class = serializers.QoSComplianceSerializer
    filterset_fields = ["pool", "policy"]
