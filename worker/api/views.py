"""Rollout endpoints: list and follow them; operators start, pause, resume and cancel them. Admission policies:
what Tessera keeps in each cluster for QoS policies enforced at admission (read-only). Importing a cluster's own
NVIDIA configs as profiles (it reads the cluster through the driver)."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response
from rest_framework.views import APIView

from core.audit import Actor
from core.roles import Role
from fleet.models import Cluster, Node
from scheduling.api import serializers as scheduling_serializers
from scheduling.kueue import kueue_binding_delete, kueue_binding_set
from scheduling.models import KueueBinding
from sharing.api.serializers import SharingProfileSerializer
from sharing.models import SharingProfile
from worker import config_import, rollouts
from worker.admission import admission_state_forget, admission_states
from worker.api import serializers
from worker.filtersets import NodeChangeFilterSet, RolloutFilterSet
from worker.kueue import kueue_take_over
from worker.models import NodeChange, NodeRetry, Rollout


class RolloutViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Rollouts, newest first; the detail lists every node change."""

    queryset = Rollout.objects.select_related("pool", "profile").with_progress().order_by("-created_at", "-pk")
    filterset_class = RolloutFilterSet
    ordering_fields = ["created_at", "status"]
    search_fields = ["title"]
    write_role = Role.OPERATOR

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "retrieve":
            queryset = queryset.prefetch_related("changes__node")
        return queryset

    def get_serializer_class(self):
        if self.action == "create":
            return serializers.RolloutStartSerializer
        return serializers.RolloutDetailSerializer if self.action == "retrieve" else serializers.RolloutSerializer

    @extend_schema(request=serializers.RolloutStartSerializer, responses={201: serializers.RolloutSerializer})
    def create(self, request, *args, **kwargs):
        """Start one rollout of the scope's drifted nodes; 201 with the rollout and its `Location`."""
        body = serializers.RolloutStartSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        pool, nodes = data.pop("pool", None), data.pop("nodes", None)
        scope = pool.nodes.all() if pool else Node.objects.filter(pk__in=[n.pk for n in nodes])
        rollout = rollouts.rollout_start(actor=Actor.from_request(request), nodes=scope, **data)
        return _created(rollout, self.get_serializer_context())

    def _steer(self, request, service):
        rollout = service(actor=Actor.from_request(request), rollout=self.get_object())
        return Response(serializers.RolloutSerializer(rollout, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses=serializers.RolloutSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Start no new nodes; those changing finish."""
        return self._steer(request, rollouts.rollout_pause)

    @extend_schema(request=None, responses=serializers.RolloutSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        return self._steer(request, rollouts.rollout_resume)

    @extend_schema(request=None, responses=serializers.RolloutSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel nodes not yet applying; nodes mid-apply finish and are verified."""
        return self._steer(request, rollouts.rollout_cancel)

    @extend_schema(request=None, responses=serializers.RetryNowSerializer)
    @action(detail=True, methods=["post"], url_path="retry-now")
    def retry_now(self, request, pk=None):
        """End the back-off of every node this rollout's failure left waiting (failed or held back with it): the
        reconcile loop tries them again at once. Audited per node."""
        retried = rollouts.rollout_retry_now(actor=Actor.from_request(request), rollout=self.get_object())
        return Response({"retried": retried})


class NodeRetryViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes whose last change failed (or was held back with one that failed), with when the loop tries again; the
    id is the node's. `retry-now` (operators) ends the wait."""

    queryset = NodeRetry.objects.select_related("node").order_by("next_retry_at", "pk")
    serializer_class = serializers.NodeRetrySerializer
    filterset_fields = ["rollout", "failures"]
    ordering_fields = ["next_retry_at", "failures", "updated_at"]
    search_fields = ["node__name", "error"]
    write_role = Role.OPERATOR

    @extend_schema(request=None, responses=serializers.RetryNowSerializer)
    @action(detail=True, methods=["post"], url_path="retry-now")
    def retry_now(self, request, pk=None):
        """End this node's back-off: the reconcile loop tries its desired config at once (audited)."""
        retry = self.get_object()
        retried = rollouts.retry_now(actor=Actor.from_request(request), nodes=[retry.node])
        return Response({"retried": retried})


def _created(rollout: Rollout, context: dict) -> Response:
    """201 with the rollout as GET /rollouts/<id>/ lists it, and its URL in `Location`."""
    rollout = Rollout.objects.select_related("pool", "profile").with_progress().get(pk=rollout.pk)
    data = serializers.RolloutSerializer(rollout, context=context).data
    return Response(data, status=status.HTTP_201_CREATED, headers={"Location": data["url"]})


class ProfileAssignView(APIView):
    """POST /profiles/<id>/assign/: assign the profile to a pool as `mode` says (operators; `window` needs an
    admin). With `rollout`, the rollout starts with that strategy in the same transaction, so the reconcile pass
    the assignment triggers finds the nodes changing already (no race, no 400 "Nothing to roll out" for a
    POST /rollouts/ sent just after)."""

    write_role = Role.OPERATOR

    @extend_schema(
        request=serializers.ProfileAssignSerializer,
        responses={200: scheduling_serializers.AssignResponseSerializer, 201: serializers.RolloutSerializer},
        description="200 with the profile and `assignment` (what happened, when the profile applies) without "
        "`rollout`; 201 with the rollout (and `Location`) with it.",
    )
    def post(self, request, pk):
        profile = get_object_or_404(SharingProfile, pk=pk)
        body = serializers.ProfileAssignSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        assignment, rollout = rollouts.pool_assign_and_roll_out(
            actor=Actor.from_request(request),
            pool=body.validated_data["pool"],
            profile=profile,
            strategy=body.validated_data.get("rollout"),
            mode=body.validated_data["mode"],
        )
        context = {"request": request}
        if rollout is not None:
            return _created(rollout, context)
        data = SharingProfileSerializer(profile, context=context).data
        data["assignment"] = scheduling_serializers.AssignmentSerializer(assignment, context=context).data
        return Response(data)


class NodeChangeViewSet(viewsets.ReadOnlyModelViewSet):
    """Node changes across rollouts: a node's change history, or a rollout's nodes by state."""

    queryset = NodeChange.objects.select_related("node").order_by("-updated_at", "-pk")
    serializer_class = serializers.NodeChangeSerializer
    filterset_class = NodeChangeFilterSet


class AdmissionPolicyStateViewSet(viewsets.ReadOnlyModelViewSet):
    """ValidatingAdmissionPolicies Tessera keeps per cluster and pool for QoS policies enforced at admission: the
    object name, the manifest and its hash, when it was applied and checked, and the last error (`state` error: e.g.
    a cluster older than Kubernetes 1.30). Agent clusters are `not_applicable`. The detail carries the manifest."""

    queryset = admission_states()
    filterset_fields = ["cluster", "pool", "qos_policy", "state"]
    search_fields = ["object_name", "pool_name", "policy_name"]
    ordering_fields = ["applied_at", "checked_at", "updated_at"]

    def get_serializer_class(self):
        if self.action == "retrieve":
            return serializers.AdmissionPolicyStateDetailSerializer
        return serializers.AdmissionPolicyStateSerializer

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["post"])
    def forget(self, request, pk=None):
        """Admins: drop the record without touching the cluster (its API server is gone for good), so the cluster
        can be deleted or switched to the agent driver. The objects stay there, if they are; the next sync of a
        reachable cluster writes what its pools need again."""
        admission_state_forget(actor=Actor.from_request(request), state=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class KueueBindingViewSet(viewsets.ModelViewSet):
    """Pools whose Kueue quota Tessera keeps in step with their layout (docs/kueue.md): viewers read, admins write.
    Writing `enabled`, `cluster_queues` or `lead_minutes` is audited; deleting forgets the binding and leaves what
    was written in the cluster."""

    queryset = KueueBinding.objects.select_related("pool").order_by("pool__name", "pk")
    serializer_class = serializers.KueueBindingSerializer
    filterset_fields = ["pool", "enabled"]

    def _save(self, serializer, pool):
        data, instance = serializer.validated_data, serializer.instance
        serializer.instance = kueue_binding_set(
            actor=Actor.from_request(self.request),
            pool=pool,
            cluster_queues=data.get("cluster_queues", instance.cluster_queues if instance else []),
            enabled=data.get("enabled", instance.enabled if instance else True),
            lead_minutes=data.get("lead_minutes", instance.lead_minutes if instance else 15),
        )

    def perform_create(self, serializer):
        self._save(serializer, serializer.validated_data["pool"])

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance.pool)

    def perform_destroy(self, instance):
        kueue_binding_delete(actor=Actor.from_request(self.request), binding=instance)

    @extend_schema(request=serializers.KueueTakeOverSerializer, responses=serializers.KueueBindingSerializer)
    @action(detail=True, methods=["post"], url_path="take-over")
    def take_over(self, request, pk=None):
        """Admins: Tessera owns this drifted ClusterQueue's quota for the pool's flavors again; the next sync writes
        the planned values over whatever is there (audited)."""
        binding = self.get_object()
        body = serializers.KueueTakeOverSerializer(data=request.data, context={"binding": binding})
        body.is_valid(raise_exception=True)
        kueue_take_over(
            actor=Actor.from_request(request), binding=binding, cluster_queue=body.validated_data["cluster_queue"]
        )
        binding.refresh_from_db()
        return Response(self.get_serializer(binding).data)


class ClusterConfigImportView(APIView):
    """The cluster's own mig-parted and device-plugin configs (those its ClusterPolicy names) as sharing profiles.

    GET previews (any role; read only, nothing changes anywhere): per config name the verdict of the NVIDIA
    component that reads it — refused with its reason and the upstream rule — and the nodes that select it; per pair
    of names nodes run, the profile it would create. POST (admins) creates them, from a fresh read of the cluster:
    all that can be created, or `names`. Each keeps its configs' names, so once it is the default of the pool of
    the nodes that run it, the reconcile loop has nothing to change on them."""

    @extend_schema(responses=serializers.ImportPreviewSerializer)
    def get(self, request, pk):
        preview = config_import.import_preview(get_object_or_404(Cluster, pk=pk))
        return Response(serializers.ImportPreviewSerializer(preview, context={"request": request}).data)

    @extend_schema(
        request=serializers.ImportConfirmSerializer, responses=serializers.ImportedProfileSerializer(many=True)
    )
    def post(self, request, pk):
        body = serializers.ImportConfirmSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        created = config_import.import_confirm(
            actor=Actor.from_request(request),
            cluster=get_object_or_404(Cluster, pk=pk),
            names=body.validated_data.get("names"),
        )
        output = serializers.ImportedProfileSerializer(created, many=True, context={"request": request})
        return Response(output.data, status=status.HTTP_201_CREATED)
