"""Service-account tokens of pods and their review (TokenReview), as kube-apiserver >= 1.30 answers it: a pod-bound
token names its service account, pod and node. Tokens are issued through `/_sim/service-account-tokens`, standing
in for the kubelet's TokenRequest for a DaemonSet pod on that node."""

from __future__ import annotations

import secrets
import threading
import uuid
from dataclasses import dataclass

from simulator.errors import ApiError

TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


@dataclass(frozen=True)
class _Bound:
    namespace: str
    service_account: str
    pod: str
    pod_uid: str
    node: str
    audiences: tuple[str, ...]


class ServiceAccountTokens:
    """Tokens issued for pods (kept while the simulator runs), and their reviews."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tokens: dict[str, _Bound] = {}

    def issue(self, body: dict, nodes) -> dict:
        """A token for a pod of `serviceAccount` in `namespace` on `node` (which must exist), for `audiences`."""
        namespace, account, node = (body.get(key) for key in ("namespace", "serviceAccount", "node"))
        audiences = body.get("audiences") or ["https://kubernetes.default.svc"]
        if not all(isinstance(v, str) and v for v in (namespace, account, node)) or not isinstance(audiences, list):
            raise ApiError.bad_request('body must be {"namespace", "serviceAccount", "node", "audiences": [...]}')
        if node not in nodes:
            raise ApiError.not_found("nodes", node)
        pod = f"{account}-{secrets.token_hex(3)}"
        token = "sim-sa." + secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = _Bound(namespace, account, pod, str(uuid.uuid4()), node, tuple(audiences))
        return {"token": token, "pod": pod}

    def review(self, body: object) -> dict:
        """A TokenReview's answer: status.authenticated with the user and audiences, or authenticated false."""
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("token"), str):
            raise ApiError.bad_request("TokenReview spec.token is required", kind="TokenReview")
        wanted = spec.get("audiences") or []
        with self._lock:
            bound = self._tokens.get(spec["token"])
        answer = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {}, "spec": spec}
        audiences = [] if bound is None else [a for a in wanted or bound.audiences if a in bound.audiences]
        if not audiences:
            answer["status"] = {"authenticated": False, "error": "invalid bearer token"}
            return answer
        answer["status"] = {
            "authenticated": True,
            "audiences": audiences,
            "user": {
                "username": f"system:serviceaccount:{bound.namespace}:{bound.service_account}",
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{bound.namespace}",
                    "system:authenticated",
                ],
                "extra": {
                    "authentication.kubernetes.io/pod-name": [bound.pod],
                    "authentication.kubernetes.io/pod-uid": [bound.pod_uid],
                    "authentication.kubernetes.io/node-name": [bound.node],
                },
            },
        }
        return answer
