"""A test double of the server's agent endpoints (stdlib http.server), speaking agent/protocol.py strictly."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.backends.simulated import SimulatedBackend
from agent.protocol import (
    DESIRED_PATH,
    OUTCOME_PATH,
    REGISTER_PATH,
    REPORT_PATH,
    DesiredConfig,
    MigSettings,
    Outcome,
    RegisterPending,
    RegisterRequest,
    Report,
    request_fingerprint,
)
from sharing.render import MigDeviceSpec, render_mig_parted_config

JOIN_TOKEN = "join-3f9a1c77"


def mig_settings(devices: dict[str, int] | None, name: str = "layout") -> MigSettings:
    """A one-entry mig-parted config for every GPU: these MIG devices, or MIG off for None."""
    spec = MigDeviceSpec("all", devices is not None, devices or {})
    return MigSettings(render_mig_parted_config({name: [spec]}), name)


class FakeTessera:
    """Registers nodes, records reports and outcomes, serves one desired config; every body is parsed strictly."""

    def __init__(self):
        self.join_tokens = {JOIN_TOKEN}
        self.credentials: dict[str, int] = {}
        self.approval_needed: set[str] = set()  # hostnames registered already: 202 until a request key is approved
        self.approved_keys: set[str] = set()
        self.registrations: list[RegisterRequest] = []
        self.reports: list[Report] = []
        self.outcomes: list[Outcome] = []
        self.desired_fetches = 0
        self.desired: DesiredConfig | None = None
        self.interval_seconds = 7
        self.failures = {REPORT_PATH: 0, OUTCOME_PATH: 0}  # how many of the next calls answer 503
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def revoke_all(self):
        self.credentials.clear()

    def waits_for_approval(self, request: RegisterRequest) -> bool:
        """A registered hostname without its current credential or an approved key: as the real server answers."""
        if request.hostname not in self.approval_needed or request.credential in self.credentials:
            return False
        return request.request_key not in self.approved_keys

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _body(self):
                return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")

            def _node(self):
                auth = self.headers.get("Authorization", "")
                node = fake.credentials.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None
                if node is None:
                    self._send(401, {"message": "Agent credential revoked or unknown.", "errors": {}})
                return node

            def do_POST(self):
                with fake.lock:
                    if self.path == REGISTER_PATH:
                        request = RegisterRequest.from_dict(self._body())
                        if request.join_token not in fake.join_tokens:
                            return self._send(403, {"message": "Join token expired or revoked.", "errors": {}})
                        fake.registrations.append(request)
                        if fake.waits_for_approval(request):
                            pending = RegisterPending(
                                request.hostname, request_fingerprint(request.request_key or ""), "Ask an admin."
                            )
                            return self._send(202, pending.to_dict())
                        fake.credentials.pop(request.credential or "", None)
                        node_id = len(fake.registrations)
                        credential = f"cred-{node_id}-b7d01e"
                        fake.credentials[credential] = node_id
                        body = {
                            "node_id": node_id,
                            "node_name": request.hostname,
                            "credential": credential,
                            "interval_seconds": fake.interval_seconds,
                        }
                        return self._send(201, body)
                    if self._node() is None:
                        return None
                    if fake.failures.get(self.path):
                        fake.failures[self.path] -= 1
                        return self._send(503, {"message": "Service unavailable.", "errors": {}})
                    if self.path == REPORT_PATH:
                        fake.reports.append(Report.from_dict(self._body()))
                        desired = fake.desired.config_id if fake.desired else None
                        return self._send(200, {"desired_config_id": desired})
                    if self.path == OUTCOME_PATH:
                        fake.outcomes.append(Outcome.from_dict(self._body()))
                        return self._send(200, {})
                    return self._send(404, {"message": "Not found.", "errors": {}})

            def do_GET(self):
                with fake.lock:
                    if self._node() is None:
                        return None
                    if self.path == DESIRED_PATH and fake.desired is not None:
                        fake.desired_fetches += 1
                        return self._send(200, fake.desired.to_dict())
                    return self._send(404, {"message": "No desired config.", "errors": {}})

        return Handler


@pytest.fixture
def fake_server():
    fake = FakeTessera()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def make_backend():
    """Simulated backends without the background workload, so processes appear only when a test starts them."""
    backends = []

    def make(**options):
        options.setdefault("workload", False)
        options.setdefault("gpus", 2)
        backend = SimulatedBackend(**options)
        backends.append(backend)
        return backend

    yield make
    for backend in backends:
        if backend.sim._initialized:
            backend.close()
