"""HTTPS front end: routing, bearer-token auth, content negotiation (JSON, Table, protobuf in), watch streams."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

from simulator import control, protobuf, resources, tables
from simulator.errors import ApiError
from simulator.resources import NODES, PODS, STATUS_SUBRESOURCE, ResourceType
from simulator.selectors import build_matcher
from simulator.serviceaccounts import TOKEN_REVIEW_PATH
from simulator.workload import check_eviction

if TYPE_CHECKING:
    from simulator.core import Simulator

_PUBLIC = {"/version", "/healthz", "/livez", "/readyz", "/metrics"}
_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "tessera-simulator",
    "gitTreeState": "clean",
    "buildDate": "2025-04-22T16:00:00Z",
    "goVersion": "go1.23.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
# status is a subresource: the main endpoint ignores it
_STATUS_KEPT = {"nodes": ("status",), "pods": ("status",), "validatingadmissionpolicies": ("status",)}
_DEFAULT_WATCH_SECONDS = 1800
_KUBELET_PORT = "10250"


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], sim: Simulator, context: ssl.SSLContext):
        super().__init__(address, Handler)
        self.sim = sim
        self.context = context
        self.stopping = False
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def get_request(self):
        sock, address = super().get_request()
        # The TLS handshake happens in the handler thread, so a slow client cannot stall accept().
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def process_request_thread(self, request, client_address):
        with self._connections_lock:
            self._connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.discard(request)

    def close_all(self) -> None:
        """Cut keep-alive and watch connections so clients see the server go away."""
        self.stopping = True
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | ssl.SSLError | TimeoutError | OSError):
            return  # clients hang up, time out and probe; nothing to report
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else ~40 ms per request with delayed ACKs
    timeout = 300
    server_version = "tessera-simulator"
    server: ApiServer

    def setup(self) -> None:
        super().setup()
        self.request.do_handshake()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's signature
        if self.server.sim.config.log_requests:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # -- plumbing -------------------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self, code: int, body: bytes, content_type: str = "application/json", headers: dict | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, payload: dict, headers: dict | None = None) -> None:
        self._send(code, json.dumps(payload, separators=(",", ":")).encode(), headers=headers)

    def _decode(self, body: bytes) -> object:
        content_type = self.headers.get("Content-Type", "application/json").split(";")[0].strip().lower()
        if not body:
            return None
        if content_type == protobuf.MEDIA_TYPE:
            return protobuf.decode(body)
        try:
            return json.loads(body)
        except ValueError as error:
            raise ApiError.bad_request(f"the body of the request is not valid JSON: {error}") from None

    def _handle(self, method: str) -> None:
        sim = self.server.sim
        url = urlsplit(self.path)
        # Decoded as kube-apiserver does: clients percent-encode ':' in "node:port" proxy names. Names hold no '/'.
        path = unquote(url.path).rstrip("/") or "/"
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        try:
            body = self._read_body()
            if path not in _PUBLIC and self.headers.get("Authorization") != f"Bearer {sim.token}":
                raise ApiError.unauthorized()
            if path.startswith("/_sim/"):
                self._send_json(200, control.handle(sim, method, path.split("/")[2:], query, self._decode(body)))
                return
            faults = sim.faults
            if faults.latency_ms:
                time.sleep(faults.latency_ms / 1000)
            if path not in _PUBLIC:
                injected = faults.draw_error(method != "GET")
                if injected:
                    raise injected
            self._route(method, path, query, body)
        except ApiError as error:
            self._send_json(error.code, error.status(), error.headers)
        except (ConnectionError, ssl.SSLError, TimeoutError):
            self.close_connection = True
        except Exception:
            traceback.print_exc()
            self._send_json(500, ApiError(500, "InternalError", "internal error in the simulator").status())

    # -- routing --------------------------------------------------------------------------------------------

    def _route(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        if path in ("/healthz", "/livez", "/readyz"):
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return
        if path == "/version":
            self._send_json(200, _VERSION)
            return
        if path == "/metrics":
            self._send_metrics(query.get("node"))
            return
        if path == TOKEN_REVIEW_PATH and method == "POST":
            self._send_json(201, self.server.sim.service_account_tokens.review(self._decode(body)))
            return
        if path == "/openapi/v3":
            self._send_json(200, {"paths": {}})  # no schemas are published; kubectl's commands here never ask
            return
        parts = path.strip("/").split("/")
        unserved = self.server.sim.faults.unserved_resources()
        if parts[0] == "api" and len(parts) <= 2:
            document = (
                resources.api_versions() if len(parts) == 1 else resources.api_resource_list("", parts[1], unserved)
            )
        elif parts[0] == "apis" and len(parts) <= 3:
            if len(parts) == 1:
                document = resources.api_group_list()
            elif len(parts) == 2:
                document = resources.api_group(parts[1])
            else:
                document = resources.api_resource_list(parts[1], parts[2], unserved)
        elif parts[0] == "api" and parts[1] == "v1":
            self._resource(method, "", "v1", parts[2:], query, body)
            return
        elif parts[0] == "apis":
            self._resource(method, parts[1], parts[2], parts[3:], query, body)
            return
        else:
            raise ApiError.path_not_found(path)
        if document is None or method != "GET":
            raise ApiError.path_not_found(path)
        self._send_json(200, document)

    def _resource(self, method: str, group: str, version: str, rest: list[str], query: dict, body: bytes) -> None:
        types = resources.BY_GROUP_VERSION.get((group, version), {})
        watch = query.get("watch") in ("true", "1")
        if rest and rest[0] == "watch":
            watch, rest = True, rest[1:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        resource = types.get(rest[0]) if rest else None
        if resource is None or resource.qualified in self.server.sim.faults.unserved_resources():
            raise ApiError.path_not_found("/" + "/".join(rest))
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2:]
        if name is None:
            self._collection(method, resource, namespace, query, body, watch)
            return
        if resource.namespaced and namespace is None:
            raise ApiError.path_not_found(f"/{resource.plural}/{name}")
        namespace = namespace or ""
        if sub:
            self._subresource(method, resource, namespace, name, sub, body)
            return
        self._object(method, resource, namespace, name, query, body)

    def _allow(self, resource: ResourceType, verb: str, method: str) -> None:
        if verb not in resource.verbs:
            raise ApiError.method_not_allowed(method, resource.plural)

    # -- collections ----------------------------------------------------------------------------------------

    def _collection(
        self, method: str, resource: ResourceType, namespace: str | None, query: dict, body: bytes, watch: bool
    ) -> None:
        store = self.server.sim.store
        if method == "POST":
            self._allow(resource, "create", method)
            if resource.namespaced and namespace is None:
                raise ApiError.method_not_allowed(method, resource.plural)
            self._refuse_dry_run(query)
            obj = self._object_body(body, resource)
            meta = obj.setdefault("metadata", {})
            if resource.namespaced:
                if meta.get("namespace", namespace) != namespace:
                    raise ApiError.bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request"
                    )
                meta["namespace"] = namespace
                if store.find(resources.NAMESPACES, "", namespace) is None:
                    raise ApiError.not_found("namespaces", namespace)
            self._send_json(201, store.create(resource, obj))
            return
        if method != "GET":
            raise ApiError.method_not_allowed(method, resource.plural)
        self._allow(resource, "watch" if watch else "list", method)
        matcher = build_matcher(
            query.get("labelSelector"), query.get("fieldSelector"), resource.field_selectors, resource.plural
        )
        indexed = _node_from_field_selector(resource, query.get("fieldSelector"))
        if watch:
            self._watch(resource, namespace, matcher, query)
            return
        limit = int(query["limit"]) if query.get("limit", "").isdigit() else None
        entries, rv, cont = store.list(resource, namespace, matcher, limit, query.get("continue") or None, indexed)
        if self._wants_table():
            table = tables.table(resource, [e.obj for e in entries], rv, query.get("includeObject", "Metadata"), cont)
            self._send_json(200, table)
            return
        metadata = f'{{"resourceVersion":"{rv}"' + (f',"continue":"{cont}"' if cont else "") + "}"
        head = f'{{"kind":"{resource.list_kind}","apiVersion":"{resource.api_version}","metadata":{metadata},"items":['
        self._send(200, head.encode() + b",".join(e.raw for e in entries) + b"]}")

    def _wants_table(self) -> bool:
        accept = self.headers.get("Accept", "")
        return "as=Table" in accept and "g=meta.k8s.io" in accept

    # -- single objects -------------------------------------------------------------------------------------

    def _object(self, method: str, resource: ResourceType, namespace: str, name: str, query: dict, body: bytes) -> None:
        store = self.server.sim.store
        keep = _STATUS_KEPT.get(resource.plural, ()) or (("status",) if resource.plural in STATUS_SUBRESOURCE else ())
        if method == "GET":
            self._allow(resource, "get", method)
            entry = store.get(resource, namespace, name)
            if self._wants_table():
                table = tables.table(
                    resource, [entry.obj], store.resource_version, query.get("includeObject", "Metadata"), None
                )
                self._send_json(200, table)
            else:
                self._send(200, entry.raw)
            return
        self._refuse_dry_run(query)
        if method == "PUT":
            self._allow(resource, "update", method)
            self._send_json(200, store.replace(resource, namespace, name, self._object_body(body, resource), keep))
        elif method == "PATCH":
            self._allow(resource, "patch", method)
            content_type = self.headers.get("Content-Type", "")
            self._send_json(200, store.patch(resource, namespace, name, content_type, self._decode(body), keep))
        elif method == "DELETE":
            self._allow(resource, "delete", method)
            deleted = store.delete(resource, namespace, name)
            if resource is PODS:
                self._send_json(200, deleted)
            else:
                details = {
                    "name": name,
                    "group": resource.group,
                    "kind": resource.plural,
                    "uid": deleted["metadata"]["uid"],
                }
                self._send_json(
                    200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
                )
        else:
            raise ApiError.method_not_allowed(method, resource.plural)

    def _subresource(
        self, method: str, resource: ResourceType, namespace: str, name: str, sub: list[str], body: bytes
    ) -> None:
        sim = self.server.sim
        if sub == ["status"] and resource.plural in STATUS_SUBRESOURCE:
            self._status(method, resource, namespace, name, body)
            return
        if resource is PODS and sub == ["eviction"] and method == "POST":
            eviction = self._decode(body) or {}
            if not isinstance(eviction, dict) or eviction.get("metadata", {}).get("name", name) != name:
                raise ApiError.bad_request("name in URL does not match name in Eviction object")
            pod = sim.store.get(PODS, namespace, name).obj
            check_eviction(pod, sim.faults.take_eviction_refusal(f"{namespace}/{name}"))
            sim.store.delete(PODS, namespace, name)
            self._send_json(
                201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
            )
            return
        if resource is NODES and sub[0] == "proxy" and method == "GET":
            node, _, port = name.partition(":")
            if port in ("", _KUBELET_PORT) and sub[1:] == ["configz"]:
                self._send_json(200, sim.kubelet_configz(node))
                return
            # Nothing else listens on a node: dcgm-exporter has no hostPort (contracts §10), so :9400 is refused.
            address = sim.nodes[node].internal_ip if node in sim.nodes else node
            sim.store.get(NODES, "", node)
            raise ApiError(
                503,
                "ServiceUnavailable",
                f"error trying to reach service: dial tcp {address}:{port or _KUBELET_PORT}: connect: "
                "connection refused",
            )
        if resource is PODS and sub[0] == "proxy" and method == "GET":
            pod, port = _proxy_target(name)
            if sub[1:] != ["metrics"]:
                raise ApiError(503, "ServiceUnavailable", f"no endpoint at {name}/{'/'.join(sub[1:])}")
            text = sim.exporter_metrics(namespace, pod, port)
            self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            return
        raise ApiError.path_not_found(f"/{resource.plural}/{name}/{'/'.join(sub)}")

    def _status(self, method: str, resource: ResourceType, namespace: str, name: str, body: bytes) -> None:
        """The status subresource of a custom resource: GET reads the object, PUT and PATCH change its status only
        (everything else is kept as stored, as the API server does for CRDs with `subresources.status`)."""
        store = self.server.sim.store
        if method == "GET":
            self._send(200, store.get(resource, namespace, name).raw)
            return
        if method == "PUT":
            obj = self._object_body(body, resource)
            self._send_json(200, store.replace(resource, namespace, name, obj, keep_all_but=("status",)))
        elif method == "PATCH":
            content_type = self.headers.get("Content-Type", "")
            patched = store.patch(resource, namespace, name, content_type, self._decode(body), keep_all_but=("status",))
            self._send_json(200, patched)
        else:
            raise ApiError.method_not_allowed(method, f"{resource.plural}/status")

    def _object_body(self, body: bytes, resource: ResourceType) -> dict:
        obj = self._decode(body)
        if not isinstance(obj, dict):
            raise ApiError.bad_request(f"the request body must be a {resource.kind} object")
        kind = obj.get("kind")
        if kind and kind != resource.kind:
            raise ApiError.bad_request(f"the body is a {kind}, expected {resource.kind}")
        return obj

    @staticmethod
    def _refuse_dry_run(query: dict) -> None:
        if query.get("dryRun"):
            raise ApiError.bad_request("dryRun is not supported by the simulator")

    def _send_metrics(self, node: str | None) -> None:
        text = self.server.sim.metrics_text(node)
        self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    # -- watch ----------------------------------------------------------------------------------------------

    def _watch(self, resource: ResourceType, namespace: str | None, matcher, query: dict) -> None:
        """Newline-delimited events over chunked transfer; too-old resourceVersions get an ERROR event with 410."""
        sim = self.server.sim
        store = sim.store
        timeout = int(query["timeoutSeconds"]) if query.get("timeoutSeconds", "").isdigit() else _DEFAULT_WATCH_SECONDS
        deadline = time.monotonic() + timeout
        faults = sim.faults.as_dict()
        drop_events, drop_seconds = faults["watch_drop_after_events"], faults["watch_drop_after_seconds"]
        drop_at = time.monotonic() + drop_seconds if drop_seconds else None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        sent = 0

        def emit(kind: str, raw: bytes) -> bool:
            nonlocal sent
            line = b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            sent += 1
            return bool(drop_events) and sent >= drop_events

        requested = query.get("resourceVersion", "")
        if requested in ("", "0"):
            entries, cursor, _ = store.list(resource, namespace, matcher)
            for entry in entries:
                if emit("ADDED", entry.raw):
                    return self._abort()
        elif requested.isdigit():
            cursor = int(requested)
        else:
            invalid = ApiError.bad_request(f"invalid resource version {requested!r}")
            emit("ERROR", json.dumps(invalid.status()).encode())
            return self._end_chunks()
        while not self.server.stopping and not store.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if drop_at and time.monotonic() >= drop_at:
                return self._abort()
            try:
                changes, cursor = store.changes_since(cursor, min(left, 1.0))
            except ApiError as gone:
                emit("ERROR", json.dumps(gone.status()).encode())
                return self._end_chunks()
            for change in changes:
                kind = _event_type(change, resource, namespace, matcher)
                if kind and emit(kind, change.entry.raw):
                    return self._abort()
        if query.get("allowWatchBookmarks") == "true":
            bookmark = {
                "kind": resource.kind,
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(cursor)},
            }
            emit("BOOKMARK", json.dumps(bookmark).encode())
        self._end_chunks()

    def _end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def _abort(self) -> None:
        """A dropped watch: the connection is cut mid-stream, as a load balancer or a restart would."""
        self.close_connection = True
        self.request.shutdown(socket.SHUT_RDWR)


def _event_type(change, resource: ResourceType, namespace: str | None, matcher) -> str | None:
    """The event a filtered watch sees: objects entering or leaving the selection are ADDED / DELETED."""
    if change.resource is not resource or (namespace is not None and change.namespace != namespace):
        return None
    if matcher is None:
        return change.type
    new_match = change.type != "DELETED" and matcher(change.entry.obj)
    old_match = change.old is not None and matcher(change.old)
    if change.type == "DELETED":
        return "DELETED" if old_match else None
    if new_match and old_match:
        return "MODIFIED"
    if new_match:
        return "ADDED"
    return "DELETED" if old_match else None


def _node_from_field_selector(resource: ResourceType, selector: str | None) -> str | None:
    """`spec.nodeName=X` on pods is served from the by-node index (drain and the MIG Manager ask for it)."""
    if resource is not PODS or not selector:
        return None
    for term in selector.split(","):
        field, _, value = term.partition("=")
        if field.strip() == "spec.nodeName":
            return value.lstrip("=").strip()
    return None


def _proxy_target(name: str) -> tuple[str, str]:
    """The pod and port of a proxy path's `[scheme:]name[:port]`, as kube-apiserver splits it."""
    parts = name.split(":")
    if len(parts) == 3:
        return parts[1], parts[2]
    if len(parts) == 2:
        return parts[0], parts[1]
    return name, ""
