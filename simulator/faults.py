"""Fault knobs: what can go wrong between a client and the API server, and on a node. Seeded, so replayable."""

from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass, field, fields

from simulator.errors import ApiError


@dataclass
class Faults:
    """Current knob values; `update()` takes the JSON of `POST /_sim/faults` (any subset of fields)."""

    latency_ms: float = 0.0
    error_rate: float = 0.0  # fraction of all API requests answered with an error from `error_codes`
    write_error_rate: float = 0.0  # extra fraction for POST/PUT/PATCH/DELETE
    error_codes: list[int] = field(default_factory=lambda: [500, 503, 429])
    watch_drop_after_events: int = 0  # 0 = never; else the connection is cut after that many events
    watch_drop_after_seconds: float = 0.0
    apply_delay: float = 1.0  # seconds per MIG Manager step (pending -> success, pending -> rebooting -> success)
    wedge: dict[str, int] = field(default_factory=dict)  # node -> number of next applies that stay pending
    failing_nodes: list[str] = field(default_factory=list)  # every apply on these nodes ends `failed`
    reboot_nodes: list[str] = field(default_factory=list)  # MIG mode changes need a reboot (WITH_REBOOT=true)
    refuse_eviction: dict[str, int] = field(default_factory=dict)  # "ns/pod" -> refusals left (-1 = always)
    xid: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> {gpu index: XID code} injected
    # Resources ("plural.group", e.g. validatingadmissionpolicies.admissionregistration.k8s.io) this API server does
    # not serve, as an older Kubernetes: left out of discovery, and 404 "could not find the requested resource".
    unserved: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        self._random = random.Random()

    def seed(self, seed: int) -> None:
        self._random.seed(seed ^ 0xFA17)

    def update(self, changes: dict) -> None:
        known = {f.name: f for f in fields(self)}
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ApiError.bad_request(f"unknown fault knobs: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        with self._lock:
            for name, value in changes.items():
                default = getattr(self, name)
                if isinstance(default, float) and isinstance(value, int | float) and not isinstance(value, bool):
                    value = float(value)
                if type(value) is not type(default):
                    raise ApiError.bad_request(f"fault knob {name} must be a {type(default).__name__}")
                setattr(self, name, value)

    def as_dict(self) -> dict:
        with self._lock:
            return asdict(self)

    def draw_error(self, is_write: bool) -> ApiError | None:
        """Maybe an injected error for this request; 409 is only drawn for writes."""
        with self._lock:
            rate = self.error_rate + (self.write_error_rate if is_write else 0.0)
            if rate <= 0 or self._random.random() >= rate:
                return None
            codes = [code for code in self.error_codes if is_write or code != 409] or [500]
            return ApiError.injected(self._random.choice(codes))

    def take_wedge(self, node: str) -> bool:
        with self._lock:
            left = self.wedge.get(node, 0)
            if left <= 0:
                return False
            self.wedge[node] = left - 1
            return True

    def take_eviction_refusal(self, pod_key: str) -> bool:
        with self._lock:
            left = self.refuse_eviction.get(pod_key, 0)
            if left == 0:
                return False
            if left > 0:
                self.refuse_eviction[pod_key] = left - 1
            return True

    def is_failing(self, node: str) -> bool:
        with self._lock:
            return node in self.failing_nodes

    def needs_reboot(self, node: str) -> bool:
        with self._lock:
            return node in self.reboot_nodes

    def unserved_resources(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self.unserved)

    def injected_xid(self, node: str, gpu: int) -> int:
        with self._lock:
            return self.xid.get(node, {}).get(str(gpu), 0)
