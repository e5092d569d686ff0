"""Agent join tokens and node credentials as admins manage them: create, revoke, and the secrets they carry.

A secret reads `<prefix>_<key id>_<secret>`: the key id finds the row, the SHA-256 of the secret is compared in
constant time. Neither join tokens nor credentials are stored, logged or shown again after they are created.
Trading a join token for a credential and authenticating with one is the agent's side (agents/credentials.py).
"""

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.choices import ClusterDriver
from fleet.models import AgentCredential, AgentJoinToken, Cluster, Node, PendingAgent

JOIN_TOKEN_PREFIX = "tsj"
CREDENTIAL_PREFIX = "tsa"
JOIN_TOKEN_LIFETIME = timedelta(hours=24)
_NO_HASH = "0" * 64  # compared against when no row matched, so a miss costs what a wrong secret costs
NODE_NAME_PATTERN_RE = re.compile(r"^[-A-Za-z0-9_.*?\[\]!]{1,253}$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
SERVICE_ACCOUNT_RE = re.compile(rf"^{_DNS_LABEL}:{_DNS_LABEL}(\.{_DNS_LABEL})*$")


def agent_interval_seconds() -> int:
    """How often agents report; three missed reports make an agent node stale (fleet.querysets)."""
    return int(settings.TESSERA.get("AGENT_INTERVAL_SECONDS", 15))


# --- secrets -------------------------------------------------------------------------------------------------------


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_new(prefix: str) -> tuple[str, str, str]:
    """(plain token, key id, hash of the secret part)."""
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return f"{prefix}_{key_id}_{secret}", key_id, _digest(secret)


def secret_split(token: str, prefix: str) -> tuple[str, str] | None:
    """(key id, secret) of a token with this prefix, or None when it is not shaped like one."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != prefix or not 1 <= len(parts[1]) <= 16 or not parts[2]:
        return None
    return parts[1], parts[2]


def secret_matches(secret: str, secret_hash: str | None) -> bool:
    """Constant time; pass None when no row matched, so an unknown key id costs what a wrong secret costs."""
    return hmac.compare_digest(_digest(secret), secret_hash or _NO_HASH)


# --- join tokens ---------------------------------------------------------------------------------------------------


@transaction.atomic
def agent_join_token_create(
    *,
    actor: Actor,
    cluster: Cluster,
    name: str,
    description: str = "",
    expires_at: datetime | None = None,
    max_uses: int | None = None,
    node_name_pattern: str = "",
    service_account: str = "",
    now=None,
) -> tuple[AgentJoinToken, str]:
    """Create a join token for an agent cluster; returns the row and the plain token, which is never shown again.
    `max_uses` 1 makes it single-use; `node_name_pattern` (fnmatch) limits the node names it registers;
    `service_account` ("namespace:name") makes every registration present that account's token, reviewed by the
    cluster's API server, and register as the pod's node."""
    now = now or timezone.now()
    expires_at = expires_at or now + JOIN_TOKEN_LIFETIME
    node_name_pattern, service_account = node_name_pattern.strip(), service_account.strip()
    errors: dict[str, list[str]] = {}
    if cluster.driver != ClusterDriver.AGENT:
        errors["cluster"] = [
            f"Cluster {cluster.name} is driven through Kubernetes; join tokens are for agent clusters."
        ]
    if not name.strip():
        errors["name"] = ["Give the token a name, e.g. the DaemonSet or rack it is for."]
    if expires_at <= now:
        errors["expires_at"] = ["The expiry must be in the future."]
    if max_uses is not None and max_uses < 1:
        errors["max_uses"] = ["Allow at least one registration, or leave it empty for any number until expiry."]
    if node_name_pattern and not NODE_NAME_PATTERN_RE.match(node_name_pattern):
        errors["node_name_pattern"] = ["Node name characters and the wildcards * ? [ ] ! only, e.g. rack-b12-*."]
    if service_account and not SERVICE_ACCOUNT_RE.match(service_account):
        errors["service_account"] = ["namespace:name of a service account, e.g. tessera-system:tessera-agent."]
    elif service_account and not (cluster.kubeconfig_path or cluster.in_cluster):
        errors["service_account"] = [
            f"Cluster {cluster.name} has no Kubernetes credentials (kubeconfig path or in-cluster) to review "
            "service-account tokens with."
        ]
    if errors:
        raise ApplicationError(next(iter(errors.values()))[0], errors=errors)
    plain, key_id, secret_hash = secret_new(JOIN_TOKEN_PREFIX)
    token = AgentJoinToken.objects.create(
        cluster=cluster,
        name=name.strip()[:100],
        description=description,
        key_id=key_id,
        secret_hash=secret_hash,
        expires_at=expires_at,
        max_uses=max_uses,
        node_name_pattern=node_name_pattern,
        service_account=service_account,
        created_by=actor.user if getattr(actor.user, "pk", None) else None,
    )
    audit_record(
        actor=actor,
        action="agent_join_token.create",
        obj=token,
        after={
            "cluster": cluster.name,
            "expires_at": expires_at.isoformat(),
            "max_uses": max_uses,
            "node_name_pattern": node_name_pattern,
            "service_account": service_account,
        },
        now=now,
    )
    return token, plain


@transaction.atomic
def agent_join_token_revoke(*, actor: Actor, token: AgentJoinToken, now=None) -> AgentJoinToken:
    """Refuse further registrations with this token; nodes that registered with it keep their credentials."""
    now = now or timezone.now()
    if not AgentJoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
        raise ApplicationError(f"Join token {token.name} is already revoked.", status=409)
    token.refresh_from_db()
    audit_record(actor=actor, action="agent_join_token.revoke", obj=token, after={"revoked_at": now.isoformat()})
    return token


# --- credentials ---------------------------------------------------------------------------------------------------


@transaction.atomic
def agent_credential_revoke(*, actor: Actor, credential: AgentCredential, now=None) -> AgentCredential:
    """Revoke one agent credential: its next call gets 401 and the agent stops (exit 3) until registered again."""
    now = now or timezone.now()
    if not AgentCredential.objects.filter(pk=credential.pk, revoked_at__isnull=True).update(revoked_at=now):
        raise ApplicationError(f"Agent credential {credential.key_id} is already revoked.", status=409)
    credential.refresh_from_db()
    audit_record(
        actor=actor,
        action="node.agent_revoke",
        obj=credential.node,
        before={"credential": credential.key_id, "active": True},
        after={"credential": credential.key_id, "active": False},
        now=now,
    )
    return credential


@transaction.atomic
def node_agent_revoke(*, actor: Actor, node: Node, now=None) -> AgentCredential:
    """Revoke the node's active agent credential."""
    credential = AgentCredential.objects.select_related("node").filter(node=node, revoked_at__isnull=True).first()
    if credential is None:
        raise ApplicationError(f"Node {node.name} has no active agent credential.", status=409)
    return agent_credential_revoke(actor=actor, credential=credential, now=now)


# --- agents waiting for an admin -----------------------------------------------------------------------------------


@transaction.atomic
def pending_agent_decide(*, actor: Actor, pending: PendingAgent, approve: bool, now=None) -> PendingAgent:
    """Approve (the agent collects a credential at its next call; the node's current one is revoked then) or reject
    (its next call gets 403 and it stops) an agent's request to register an existing node; 409 once decided or
    expired."""
    now = now or timezone.now()
    status = PendingAgent.Status.APPROVED if approve else PendingAgent.Status.REJECTED
    decided_by = actor.user if getattr(actor.user, "pk", None) else None
    if (
        not PendingAgent.objects.current(now)
        .filter(pk=pending.pk, status=PendingAgent.Status.PENDING)
        .update(status=status, decided_at=now, decided_by=decided_by)
    ):
        pending.refresh_from_db()
        if pending.status == PendingAgent.Status.PENDING:
            raise ApplicationError(
                f"The request {pending.fingerprint} for node {pending.node.name} expired: it waited more than "
                f"{settings.TESSERA['PENDING_AGENT_TTL_HOURS']} hours. An agent still asking makes a new one.",
                status=409,
            )
        raise ApplicationError(
            f"The request {pending.fingerprint} for node {pending.node.name} is {pending.status} already.", status=409
        )
    pending.refresh_from_db()
    audit_record(
        actor=actor,
        action="node.agent_register_approve" if approve else "node.agent_register_reject",
        obj=pending.node,
        before={"request": pending.fingerprint, "status": PendingAgent.Status.PENDING},
        after={"request": pending.fingerprint, "status": status, "address": pending.address},
        now=now,
    )
    return pending
