"""Asking a cluster's API server who holds a service-account token (TokenReview): how an agent in a DaemonSet pod
proves which node it runs on, with no long-lived secret of its own."""

from dataclasses import dataclass

from kubernetes import client

from worker.drivers.base import DriverError
from worker.drivers.kubernetes.api import api_client, error_text, read_json

AGENT_AUDIENCE = "tessera"  # the audience of the agent's projected token: it is good for Tessera only
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"  # set by Kubernetes >= 1.30 for pod-bound tokens


@dataclass(frozen=True)
class ReviewedToken:
    """What the API server vouches for: the service account (namespace:name) and the node of the token's pod."""

    service_account: str
    node_name: str


def _never(_exc: BaseException) -> bool:
    return False


def service_account_token_review(cluster, token: str) -> ReviewedToken | None:
    """The cluster API server's verdict on a pod's service-account token for audience "tessera": None when it does
    not authenticate it or it is bound to no node. One attempt (an agent's registration waits on it; the agent
    retries); DriverError when the API server cannot be asked."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": [AGENT_AUDIENCE]},
    }
    api = client.AuthenticationV1Api(api_client(cluster))
    try:
        status = read_json(api.create_token_review, body, retry_if=_never).get("status") or {}
    except Exception as exc:
        message = f"cannot review the token with cluster {cluster.name}: {error_text(exc)}"
        raise DriverError(message, transient=True) from None
    # The API server names the audiences it checked; none named means the token was not checked for Tessera's.
    if not status.get("authenticated") or AGENT_AUDIENCE not in (status.get("audiences") or []):
        return None
    user = status.get("user") or {}
    prefix, _, account = (user.get("username") or "").partition(":serviceaccount:")
    node_names = (user.get("extra") or {}).get(NODE_NAME_EXTRA) or []
    if prefix != "system" or not account or len(node_names) != 1:
        return None
    return ReviewedToken(service_account=account, node_name=node_names[0])
