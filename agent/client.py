"""HTTP to the Tessera server with the standard library only, so the agent's dependencies stay NVML and YAML."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from agent import AGENT_VERSION
from agent.protocol import (
    DESIRED_PATH,
    OUTCOME_PATH,
    REGISTER_PATH,
    REPORT_PATH,
    DesiredConfig,
    ErrorBody,
    Outcome,
    ProtocolError,
    RegisterPending,
    RegisterRequest,
    RegisterResponse,
    Report,
    ReportResponse,
)


class ServerError(Exception):
    """The server could not be reached or said no; the text is safe to log (no credential, no token)."""


class TransientError(ServerError):
    """Network trouble, a timeout, 429 or 5xx: try again later."""


class AuthError(ServerError):
    """401/403: the join token or credential is wrong or revoked; retrying will not help."""


class RejectedError(ServerError):
    """Any other 4xx, or an answer that breaks the protocol."""


class PendingApproval(ServerError):
    """202 from /register/: the node exists and an admin must approve this agent; ask again later."""


def server_url_problem(url: str, *, insecure_lab: bool) -> str | None:
    """Why the agent will not talk to this server URL, or None. Over http:// the join token, the credential and every
    report cross the network in clear text and anyone on the path can answer as the server: only a lab that says so
    (--insecure-lab) may use it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"the server URL must be https://host[:port], not {url!r}"
    if parts.scheme == "http" and not insecure_lab:
        return (
            f"refusing the plain-HTTP server URL {url}: credentials and reports would cross the network in clear "
            "text; use https://, or pass --insecure-lab (TESSERA_INSECURE_LAB=1) on a lab machine"
        )
    return None


def _error_message(error: urllib.error.HTTPError) -> str:
    """The server's `message` (and field errors) from its one error shape, else the HTTP status line."""
    try:
        body = ErrorBody.from_dict(json.loads(error.read() or b"null"))
    except (ValueError, ProtocolError):
        return f"HTTP {error.code} {error.reason}"
    details = "; ".join(f"{name}: {', '.join(map(str, problems))}" for name, problems in body.errors.items())
    return f"{body.message} ({details})" if details else body.message


def _read(message_type: type, data: Any) -> Any:
    try:
        return message_type.from_dict(data)
    except ProtocolError as error:
        raise RejectedError(f"the server's answer breaks the agent protocol: {error}") from None


class ServerClient:
    """The four agent endpoints of agent/protocol.py."""

    def __init__(self, server: str, *, credential: str | None = None, timeout: float = 15.0):
        self.server = server.rstrip("/")
        self.credential = credential
        self.timeout = timeout

    def register(self, request: RegisterRequest) -> RegisterResponse | RegisterPending:
        """201 gives the credential; 202 (an answer without one) says the registration waits for an admin."""
        answer = self._call("POST", REGISTER_PATH, request.to_dict(), authenticated=False)
        if isinstance(answer, dict) and "credential" not in answer:
            return _read(RegisterPending, answer)
        return _read(RegisterResponse, answer)

    def report(self, report: Report) -> ReportResponse:
        return _read(ReportResponse, self._call("POST", REPORT_PATH, report.to_dict()))

    def desired(self) -> DesiredConfig:
        return _read(DesiredConfig, self._call("GET", DESIRED_PATH))

    def outcome(self, outcome: Outcome) -> None:
        self._call("POST", OUTCOME_PATH, outcome.to_dict())

    def _call(self, method: str, path: str, body: dict | None = None, *, authenticated: bool = True) -> Any:
        headers = {"Accept": "application/json", "User-Agent": f"tessera-agent/{AGENT_VERSION}"}
        if authenticated:
            headers["Authorization"] = f"Bearer {self.credential}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            message = _error_message(error)
            if error.code in (401, 403):
                raise AuthError(message) from None
            if error.code == 429 or error.code >= 500:
                raise TransientError(f"{method} {path}: {message}") from None
            raise RejectedError(f"{method} {path}: {message}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise TransientError(f"{method} {self.server}{path}: {reason}") from None
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            raise TransientError(f"{method} {path}: the answer is not JSON") from None
