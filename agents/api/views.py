"""Node agent endpoints under /api/v1/agent/ (exactly agent/protocol.py), and their admin: join tokens, agent
credentials, revoking a node's agent. Every agent endpoint acts on the node of the calling credential only."""

import dataclasses
import json

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import JSONParser
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from agent.protocol import (
    DesiredConfig,
    ErrorBody,
    Outcome,
    ProtocolError,
    RegisterPending,
    RegisterRequest,
    RegisterResponse,
    Report,
    ReportMetrics,
    ReportResponse,
)
from agents import claims, credentials, outcomes, reports, selectors
from agents.api import serializers as s
from agents.authentication import AgentCredentialAuthentication, AgentRateThrottle, AgentRegisterThrottle, IsAgent
from core.addresses import client_address
from core.audit import Actor
from core.exceptions import ApplicationError
from core.roles import Role
from fleet import agent_credentials
from fleet.api.protocol import protocol_serializer
from fleet.models import AgentCredential, AgentJoinToken, Node, PendingAgent, UuidConflict

AGENT_TAG = "agent"
mirror = protocol_serializer
ERROR = mirror(ErrorBody)
ERRORS = {
    401: OpenApiResponse(ERROR, description="Agent credential revoked or unknown."),
    429: OpenApiResponse(ERROR, description="Throttled: retry later."),
}
INVALID = {400: OpenApiResponse(ERROR, description="The body breaks the protocol.")}
FOREIGN = {409: OpenApiResponse(ERROR, description="The report names a GPU or MIG UUID another live node holds.")}


def _decode(message_type, data):
    """A protocol message from a request body, or the one error shape naming the field that breaks it."""
    try:
        return s.protocol_decode(message_type, data)
    except ProtocolError as error:
        where, _, problem = str(error).partition(" ")
        field = where.partition(".")[2] or "non_field_errors"
        raise ApplicationError(f"Invalid input: {field}: {problem}", errors={field: [problem]}) from None


# A report read for its metrics alone (its digest vouches for the rest) must still carry every field a Report needs:
# an agent that breaks the contract hears so whichever path its report takes.
REPORT_REQUIRED = tuple(
    f.name
    for f in dataclasses.fields(Report)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


def _require_report_fields(data) -> None:
    missing = next((name for name in REPORT_REQUIRED if name not in data), None)
    if missing is not None:
        raise ApplicationError(f"Invalid input: {missing}: is required", errors={missing: ["is required"]})


class AgentJSONParser(JSONParser):
    """The body as one `json.loads` of its bytes (DRF's parser decodes through a stream reader, slower)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return json.loads(stream.read() if stream is not None else b"null")
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deeply, a 400 like any bad JSON
            raise ParseError(f"JSON parse error - {error}") from None


class JSONOnly(BaseContentNegotiation):
    """Agents speak JSON only: nothing to negotiate."""

    def select_parser(self, request, parsers):
        return parsers[0]

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class AgentView(APIView):
    """Node credential only (no user sessions or tokens), throttled per credential, JSON only."""

    authentication_classes = [AgentCredentialAuthentication]
    permission_classes = [IsAgent]
    throttle_classes = [AgentRateThrottle]
    parser_classes = [AgentJSONParser]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = JSONOnly


class AgentRegisterView(AgentView):
    """Trade the cluster's join token for this node's credential."""

    authentication_classes = []
    permission_classes = [AllowAny]
    throttle_classes = [AgentRegisterThrottle]

    @extend_schema(
        tags=[AGENT_TAG],
        auth=[],
        request=mirror(RegisterRequest),
        responses={
            201: mirror(RegisterResponse),
            202: mirror(RegisterPending),
            **INVALID,
            403: OpenApiResponse(
                ERROR,
                description="Join token unknown, expired, revoked, used up or not for this node; the node exists "
                "and the agent's credential, service-account token or approval request does not hold.",
            ),
            409: OpenApiResponse(ERROR, description="The node was registered meanwhile: ask again."),
            429: ERRORS[429],
            503: OpenApiResponse(ERROR, description="The cluster's API server cannot review the token now."),
        },
    )
    def post(self, request):
        message = _decode(RegisterRequest, request.data)
        registration = credentials.agent_register(
            join_token=message.join_token,
            hostname=message.hostname,
            agent_version=message.agent_version,
            credential=message.credential,
            service_account_token=message.service_account_token,
            request_key=message.request_key,
            address=client_address(request._request),
        )
        if isinstance(registration, credentials.PendingRegistration):
            pending = RegisterPending(
                node_name=registration.node.name,
                fingerprint=registration.fingerprint,
                message=f"Node {registration.node.name} is registered already: an admin must approve this agent "
                f"(request {registration.fingerprint}) in Tessera, under Agent join tokens.",
            )
            return Response(pending.to_dict(), status=status.HTTP_202_ACCEPTED)
        answer = RegisterResponse(
            node_id=registration.node.pk,
            node_name=registration.node.name,
            credential=registration.credential,
            interval_seconds=registration.interval_seconds,
        )
        return Response(answer.to_dict(), status=status.HTTP_201_CREATED)


class AgentReportView(AgentView):
    """Inventory and metrics of the caller's node; answers with the config id the node should run."""

    @extend_schema(
        tags=[AGENT_TAG],
        request=mirror(Report),
        responses={
            200: mirror(ReportResponse),
            **INVALID,
            **ERRORS,
            403: OpenApiResponse(ERROR, description="The report names another node."),
            **FOREIGN,
        },
    )
    def post(self, request):
        credential = request.auth
        # The usual report is read for its metrics alone; its inventory only when the server does not have it.
        metrics = _decode(ReportMetrics, request.data)
        _require_report_fields(request.data)
        recorded, desired = reports.agent_report_record_metrics(
            node=credential.node, metrics=metrics, serving=credential.serving_change
        )
        if not recorded:
            desired = reports.agent_report_record(
                node=credential.node, report=_decode(Report, request.data), serving=credential.serving_change
            )
        # Plain bytes, not a DRF Response: rendering one costs a tenth of the whole report (bench/b2_agent_ingest.py).
        return HttpResponse(json.dumps({"desired_config_id": desired}), content_type="application/json")


class AgentDesiredView(AgentView):
    """The config the caller's node should run (a rollout's change, or what it runs already)."""

    @extend_schema(
        tags=[AGENT_TAG],
        responses={
            200: mirror(DesiredConfig),
            404: OpenApiResponse(ERROR, description="Nothing to apply."),
            **ERRORS,
        },
    )
    def get(self, request):
        desired = selectors.agent_desired_config(request.auth.node)
        if desired is None:
            raise ApplicationError("Nothing to apply: no rollout is changing this node.", status=404)
        return Response(desired.to_dict())


class AgentOutcomeView(AgentView):
    """How applying a desired config went, with a fresh report; repeats are accepted and change nothing."""

    @extend_schema(
        tags=[AGENT_TAG],
        request=mirror(Outcome),
        responses={
            200: OpenApiResponse(description="Recorded: an empty object."),
            **INVALID,
            **ERRORS,
            403: OpenApiResponse(
                ERROR, description="The outcome names another node's change, or its report another node."
            ),
            **FOREIGN,
        },
    )
    def post(self, request):
        outcome = _decode(Outcome, request.data)
        outcomes.agent_outcome_record(node=request.auth.node, outcome=outcome)
        return Response({})


# --- admin -----------------------------------------------------------------------------------------------------


class AgentJoinTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Join tokens of agent clusters (admins only); the token itself is in the create response, and only there."""

    queryset = AgentJoinToken.objects.select_related("cluster", "created_by").order_by("-created_at", "-pk")
    serializer_class = s.AgentJoinTokenSerializer
    action_roles = {"list": Role.ADMIN, "retrieve": Role.ADMIN}
    filterset_fields = ["cluster"]

    @extend_schema(request=s.AgentJoinTokenCreateSerializer, responses={201: s.AgentJoinTokenCreatedSerializer})
    def create(self, request):
        serializer = s.AgentJoinTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        token, plain = agent_credentials.agent_join_token_create(
            actor=Actor.from_request(request), **serializer.validated_data
        )
        token = self.get_queryset().get(pk=token.pk)
        return Response({**self.get_serializer(token).data, "token": plain}, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.AgentJoinTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Refuse further registrations; registered nodes keep their credentials."""
        token = agent_credentials.agent_join_token_revoke(actor=Actor.from_request(request), token=self.get_object())
        return Response(self.get_serializer(token).data)


class AgentCredentialViewSet(viewsets.ReadOnlyModelViewSet):
    """Node agent credentials (admins only): issued at registration, revoked here or by re-registering."""

    queryset = AgentCredential.objects.select_related("node", "join_token").order_by("-created_at", "-pk")
    serializer_class = s.AgentCredentialSerializer
    action_roles = {"list": Role.ADMIN, "retrieve": Role.ADMIN}
    filterset_fields = ["node"]

    @extend_schema(request=None, responses=s.AgentCredentialSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke: the agent's next call gets 401 and it stops (exit 3) until it registers again."""
        credential = agent_credentials.agent_credential_revoke(
            actor=Actor.from_request(request), credential=self.get_object()
        )
        return Response(self.get_serializer(credential).data)


class PendingAgentViewSet(viewsets.ReadOnlyModelViewSet):
    """Agents asking to register an existing node without its credential (admins): approve or reject each within
    TESSERA["PENDING_AGENT_TTL_HOURS"] of the request."""

    queryset = PendingAgent.objects.select_related("node", "join_token", "decided_by").order_by("-requested_at", "-pk")
    serializer_class = s.PendingAgentSerializer

    def get_queryset(self):
        """Expired requests are not listed (the daily prune deletes them); deciding one says it expired (409)."""
        queryset = super().get_queryset()
        return queryset.current() if self.action == "list" else queryset

    action_roles = {"list": Role.ADMIN, "retrieve": Role.ADMIN, "approve": Role.ADMIN, "reject": Role.ADMIN}
    filterset_fields = ["node", "status"]

    @extend_schema(request=None, responses={200: s.PendingAgentSerializer, 409: ERROR})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """The agent collects its credential at its next call; the node's current credential is revoked then."""
        return self._decide(request, approve=True)

    @extend_schema(request=None, responses={200: s.PendingAgentSerializer, 409: ERROR})
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        """The agent's next call gets 403 and it stops; the node keeps its current credential."""
        return self._decide(request, approve=False)

    def _decide(self, request, *, approve: bool):
        pending = agent_credentials.pending_agent_decide(
            actor=Actor.from_request(request), pending=self.get_object(), approve=approve
        )
        return Response(self.get_serializer(pending).data)


class UuidConflictViewSet(viewsets.ReadOnlyModelViewSet):
    """GPU and MIG UUIDs a node reported while another node holds them (reads: viewers); an admin settles one."""

    queryset = UuidConflict.objects.select_related("node", "holder")
    serializer_class = s.UuidConflictSerializer
    action_roles = {"resolve": Role.ADMIN}
    filterset_fields = {"node": ["exact"], "holder": ["exact"], "resolved_at": ["isnull"]}

    @extend_schema(request=s.UuidConflictResolveSerializer, responses={200: s.UuidConflictSerializer, 409: ERROR})
    @action(detail=True, methods=["post"])
    def resolve(self, request, pk=None):
        """Settle an open conflict: the UUID stays with its holder, or goes to the reporter (docs/security.md)."""
        serializer = s.UuidConflictResolveSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        conflict = claims.uuid_conflict_resolve(
            actor=Actor.from_request(request), conflict=self.get_object(), owner=serializer.validated_data["owner"]
        )
        return Response(self.get_serializer(conflict).data)


class NodeAgentRevokeView(APIView):
    """Revoke the node's active agent credential (admins): its agent stops at its next call."""

    queryset = Node.objects.all()

    @extend_schema(tags=["nodes"], request=None, responses=s.AgentCredentialSerializer)
    def post(self, request, pk):
        node = get_object_or_404(Node, pk=pk)
        credential = agent_credentials.node_agent_revoke(actor=Actor.from_request(request), node=node)
        return Response(s.AgentCredentialSerializer(credential, context={"request": request}).data)
