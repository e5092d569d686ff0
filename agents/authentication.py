"""Who calls the agent endpoints: a node agent with its bearer credential, and nothing else.

Only the agent views list `AgentCredentialAuthentication`; the rest of the API keeps the default classes (user
tokens and sessions), which ignore a Bearer header, so a node credential is anonymous there: 401. The principal of
an agent is no user and holds no role, so even a view that listed this class would refuse it through
RolePermission (403). Agent views in turn authenticate with this class only: user tokens and sessions get 401.
"""

import os
import threading

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.throttling import SimpleRateThrottle

from agents.credentials import agent_credential_authenticate
from core.addresses import client_address
from fleet.models import AgentCredential

REFUSED = "Agent credential revoked or unknown."


class AgentPrincipal(AnonymousUser):
    """request.user of an agent call: not authenticated as a user, no groups, no role; `node` is its node."""

    def __init__(self, node):
        self.node = node

    def __str__(self):
        return f"agent of {self.node.name}"

    def get_username(self):
        return f"agent:{self.node.name}"


class AgentCredentialAuthentication(BaseAuthentication):
    """`Authorization: Bearer <credential>` → (AgentPrincipal, AgentCredential); unknown or revoked → 401."""

    keyword = "bearer"

    def authenticate(self, request):
        # The WSGI request's META itself: DRF's Request proxies every attribute through __getattr__, and this runs
        # on every agent report.
        header = request._request.META.get("HTTP_AUTHORIZATION", "").split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2 or not header[1].isascii():
            raise exceptions.AuthenticationFailed(REFUSED)
        secret = header[1]
        credential = agent_credential_authenticate(credential=secret)
        if credential is None:
            raise exceptions.AuthenticationFailed(REFUSED)
        return AgentPrincipal(credential.node), credential

    def authenticate_header(self, request):
        return 'Bearer realm="tessera-agent"'


class IsAgent(BasePermission):
    """The caller authenticated with a node credential (every agent endpoint acts on request.auth.node only)."""

    def has_permission(self, request, view):
        return isinstance(request.auth, AgentCredential)


class _WindowCounts:
    """Requests per identity in the current fixed window, in this process's memory: what DRF's throttles keep in
    Django's default cache here (local memory, per process), without serialising a value twice a request."""

    def __init__(self):
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self):
        self.lock = threading.Lock()
        self.window: int | None = None
        self.counts: dict[str, int] = {}

    def hit(self, ident: str, window: int) -> int:
        with self.lock:
            if window != self.window:
                self.window, self.counts = window, {}
            count = self.counts[ident] = self.counts.get(ident, 0) + 1
            return count


class AgentRateThrottle(SimpleRateThrottle):
    """Scope "agent" (DEFAULT_THROTTLE_RATES["agent"]), counted per credential in fixed windows, per process."""

    scope = "agent"
    counts = _WindowCounts()

    def ident(self, request) -> str:
        return request.auth.key_id if isinstance(request.auth, AgentCredential) else client_address(request._request)

    def allow_request(self, request, view):
        if self.rate is None:
            return True
        self.now = self.timer()
        window = int(self.now // self.duration)
        self.window_end = (window + 1) * self.duration
        return self.counts.hit(self.ident(request), window) <= self.num_requests

    def wait(self):
        return max(0.0, self.window_end - self.now)


class AgentRegisterThrottle(AgentRateThrottle):
    """Registrations at the "agent" rate per client address (core.addresses: never a header the client writes), so
    join tokens cannot be guessed at speed from one address however it labels its requests."""

    counts = _WindowCounts()

    def ident(self, request) -> str:
        return client_address(request._request)


class AgentCredentialScheme(OpenApiAuthenticationExtension):
    """The node credential in the OpenAPI schema."""

    target_class = AgentCredentialAuthentication
    name = "agentCredential"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A node agent's credential from POST /api/v1/agent/register/; it acts on its node only.",
        }
