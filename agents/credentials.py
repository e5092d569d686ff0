"""An agent's own credentials: a join token traded for a node credential, and the credential checked on every call.

Join tokens and credentials as admins create and revoke them, and the secrets' format, are fleet/agent_credentials.py.
"""

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agents.statements import credential_row, credential_touched
from core.audit import Actor, audit_record
from core.exceptions import ApplicationError
from fleet.agent_credentials import (
    CREDENTIAL_PREFIX,
    JOIN_TOKEN_PREFIX,
    agent_interval_seconds,
    secret_matches,
    secret_new,
    secret_split,
)
from fleet.choices import ClusterDriver
from fleet.models import AgentCredential, AgentJoinToken, Node, PendingAgent
from worker.drivers.base import DriverError
from worker.drivers.kubernetes.tokenreview import service_account_token_review

CREDENTIAL_TOUCH_SECONDS = 60  # last_used_at is a hint for admins: one write a minute per node is plenty
MAX_PENDING_PER_NODE = 5  # an admin decides on these before more may ask (each is one row and one audit event)
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Registration:
    """What an agent gets for a valid join token: its node and a credential shown this once."""

    node: Node
    credential: str = field(repr=False)
    interval_seconds: int


def _usable_join_token(plain: str, now) -> AgentJoinToken:
    """The join token of this plain text if it may register a node now; else the reason, as a 403."""
    parts = secret_split(plain, JOIN_TOKEN_PREFIX)
    token = AgentJoinToken.objects.select_related("cluster").filter(key_id=parts[0]).first() if parts else None
    if not secret_matches(parts[1] if parts else "", token.secret_hash if token else None) or token is None:
        raise ApplicationError("Join token unknown: check the token the agent was given.", status=403)
    if token.revoked_at is not None:
        raise ApplicationError(f"Join token {token.name} was revoked.", status=403)
    if token.expires_at <= now:
        raise ApplicationError(f"Join token {token.name} expired at {token.expires_at:%Y-%m-%d %H:%M} UTC.", status=403)
    if token.cluster.driver != ClusterDriver.AGENT:
        raise ApplicationError(f"Cluster {token.cluster.name} no longer uses the agent driver.", status=403)
    return token


@dataclass(frozen=True)
class PendingRegistration:
    """An agent's registration of an existing node, waiting for an admin: it asks again with the same key."""

    node: Node
    fingerprint: str


def agent_register(
    *,
    join_token: str,
    hostname: str,
    agent_version: str,
    credential: str | None = None,
    service_account_token: str | None = None,
    request_key: str | None = None,
    address: str = "",
    now=None,
) -> Registration | PendingRegistration:
    """Trade a join token for a node credential. A new node name (within the token's pattern) registers at once; a
    node the server has already only with its current credential, a service-account token its cluster vouches for
    on that node, or an admin's approval (pending until then): the old credential is revoked when the new one is
    issued. A join token naming a service account always needs its token (so the shared token alone is no key)."""
    now = now or timezone.now()
    if not HOSTNAME_RE.match(hostname):
        raise ApplicationError(
            f"Invalid hostname {hostname[:60]!r}.", errors={"hostname": ["Letters, digits, '-', '_' and '.' only."]}
        )
    token = _usable_join_token(join_token, now)
    if token.node_name_pattern and not fnmatch.fnmatchcase(hostname, token.node_name_pattern):
        raise ApplicationError(
            f"Join token {token.name} registers nodes named {token.node_name_pattern} only, not {hostname}.", status=403
        )
    # Before any write: the review is a call to the cluster's API server.
    reviewed = _reviewed_service_account(token, service_account_token, hostname)
    return _register(
        token=token,
        hostname=hostname,
        agent_version=agent_version[:50],
        credential=credential,
        reviewed=reviewed,
        request_key=request_key,
        address=address,
        now=now,
    )


def _reviewed_service_account(token: AgentJoinToken, service_account_token: str | None, hostname: str) -> bool:
    """Whether the cluster's API server vouches that this agent runs in a pod of the token's service account on
    node `hostname` (False when the token names no service account); else a 403, or a 503 when it cannot be asked."""
    if not token.service_account:
        return False
    if not service_account_token:
        raise ApplicationError(
            f"Join token {token.name} needs the agent's service-account token ({token.service_account}): "
            "see deploy/overlays/agent-only/agent-daemonset.yaml.",
            status=403,
        )
    try:
        review = service_account_token_review(token.cluster, service_account_token)
    except DriverError as error:
        raise ApplicationError(f"Cannot review the service-account token now: {error}", status=503) from None
    if review is None or review.service_account != token.service_account:
        raise ApplicationError(
            f"The cluster {token.cluster.name} does not vouch for this service-account token as "
            f"{token.service_account}.",
            status=403,
        )
    if review.node_name != hostname:
        raise ApplicationError(
            f"This agent's pod runs on node {review.node_name}; it cannot register as {hostname}.", status=403
        )
    return True


@transaction.atomic
def _register(
    *, token, hostname, agent_version, credential, reviewed, request_key, address, now
) -> Registration | PendingRegistration:
    node = Node.objects.select_for_update().filter(cluster=token.cluster, name=hostname).first()
    if node is None:
        _use_join_token(token, now)
        node, created = Node.objects.get_or_create(
            cluster=token.cluster, name=hostname, defaults={"agent_version": agent_version, "config_state_since": now}
        )
        if not created:  # registered by a concurrent request meanwhile: this one is a re-registration
            raise ApplicationError(f"Node {hostname} was registered meanwhile; ask again.", status=409)
        return _issue(node, token, agent_version, now, vouched_by="new node")
    if reviewed:
        return _issue(node, token, agent_version, now, vouched_by="service account")
    if credential is not None:
        if not _is_current_credential(node, credential):
            raise ApplicationError(f"This is not node {hostname}'s current agent credential.", status=403)
        return _issue(node, token, agent_version, now, vouched_by="current credential")
    return _pending_or_approved(node, token, agent_version, request_key, address, now)


def _use_join_token(token: AgentJoinToken, now) -> None:
    """Count a registration of a new node against the token's uses; 403 when none is left."""
    used = (
        AgentJoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True, expires_at__gt=now)
        .filter(Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses")))
        .update(uses=F("uses") + 1, last_used_at=now)
    )
    if not used:
        raise ApplicationError(
            f"Join token {token.name} is used up: it allowed {token.max_uses} registration(s).", status=403
        )


def _is_current_credential(node: Node, plain: str) -> bool:
    parts = secret_split(plain, CREDENTIAL_PREFIX)
    row = AgentCredential.objects.filter(node=node, revoked_at__isnull=True, key_id=parts[0] if parts else "").first()
    return secret_matches(parts[1] if parts else "", row.secret_hash if row else None) and row is not None


def _pending_or_approved(
    node: Node, token: AgentJoinToken, agent_version: str, request_key: str | None, address: str, now
) -> Registration | PendingRegistration:
    """The agent's request to register an existing node without its credential: asked (pending), approved (the
    credential, once), or rejected (403)."""
    if not request_key:
        raise ApplicationError(
            f"Node {node.name} is registered already: registering it again needs its current credential or an "
            "admin's approval, which this agent does not ask for (upgrade it).",
            status=403,
        )
    key_hash = hashlib.sha256(request_key.encode()).hexdigest()
    # An expired request is no request: the agent still asking makes a new one, for an admin to see afresh.
    PendingAgent.objects.expired(now).filter(node=node, key_hash=key_hash).delete()
    pending = PendingAgent.objects.select_for_update().filter(node=node, key_hash=key_hash).first()
    if pending is None:
        waiting = PendingAgent.objects.current(now).filter(node=node, status=PendingAgent.Status.PENDING)
        if waiting.count() >= MAX_PENDING_PER_NODE:
            raise ApplicationError(
                f"Node {node.name} has {MAX_PENDING_PER_NODE} registrations waiting for an admin already.", status=429
            )
        pending = PendingAgent.objects.create(
            node=node,
            join_token=token,
            key_hash=key_hash,
            agent_version=agent_version,
            address=address[:45],
            requested_at=now,
            last_asked_at=now,
        )
        audit_record(
            actor=Actor.system("tessera-agent"),
            action="node.agent_register_pending",
            obj=node,
            after={"fingerprint": pending.fingerprint, "join_token": token.name, "address": address[:45]},
            message="An agent asks to register this node again without its credential: an admin approves or rejects.",
            now=now,
        )
    elif pending.status == PendingAgent.Status.APPROVED and PendingAgent.objects.filter(
        pk=pending.pk, status=PendingAgent.Status.APPROVED
    ).update(status=PendingAgent.Status.COMPLETED, last_asked_at=now):
        return _issue(node, token, agent_version, now, vouched_by=f"approval of {pending.fingerprint}")
    elif pending.status != PendingAgent.Status.PENDING:
        raise ApplicationError(
            f"This agent's request to register node {node.name} ({pending.fingerprint}) was "
            f"{'rejected by an admin' if pending.status == PendingAgent.Status.REJECTED else 'used already'}.",
            status=403,
        )
    else:
        PendingAgent.objects.filter(pk=pending.pk).update(last_asked_at=now, agent_version=agent_version)
    return PendingRegistration(node=node, fingerprint=pending.fingerprint)


def _issue(node: Node, token: AgentJoinToken, agent_version: str, now, *, vouched_by: str) -> Registration:
    """A new credential for the node, its previous one revoked; audited with what vouched for the agent."""
    revoked = AgentCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
    plain, key_id, secret_hash = secret_new(CREDENTIAL_PREFIX)
    AgentCredential.objects.create(node=node, join_token=token, key_id=key_id, secret_hash=secret_hash)
    # A re-registered agent may have lost its applied state: its next report is recorded in full.
    Node.objects.filter(pk=node.pk).update(agent_version=agent_version, agent_report_hash="", gone_at=None)
    audit_record(
        actor=Actor.system("tessera-agent"),
        action="node.agent_register",
        obj=node,
        after={
            "join_token": token.name,
            "agent_version": agent_version,
            "new_node": vouched_by == "new node",
            "vouched_by": vouched_by,
        },
        message="re-registered; the previous credential is revoked" if revoked else "",
        now=now,
    )
    return Registration(node=node, credential=plain, interval_seconds=agent_interval_seconds())


def agent_credential_authenticate(*, credential: str, now=None) -> AgentCredential | None:
    """The active credential this bearer secret belongs to, or None. It comes with its node (the fields the agent
    services read; others load on access) and `serving_change`: (pk, config id) of the change the node should
    apply now, or None, read by the same statement or this process's cache of it (`agent_report_record` takes it).
    The secret is checked against the stored hash on every call, cached or not."""
    parts = secret_split(credential, CREDENTIAL_PREFIX)
    row = credential_row(parts[0]) if parts is not None else None
    if not secret_matches(parts[1] if parts else "", row[0].secret_hash if row else None) or row is None:
        return None
    found, node, found.serving_change = row
    found.node = node
    now = now or timezone.now()
    if found.last_used_at is None or (now - found.last_used_at).total_seconds() > CREDENTIAL_TOUCH_SECONDS:
        AgentCredential.objects.filter(pk=found.pk).update(last_used_at=now)
        found.last_used_at = now
        credential_touched(found)
    return found
