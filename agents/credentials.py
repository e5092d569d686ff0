"""An agent's own credentials: a join token traded for a node credential, and the credential checked on every call.

Join tokens and credentials as admins create and revoke them, and the secrets' format, are fleet/agent_credentials.py.
"""

import re
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agents.statements import credential_row
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
from fleet.models import AgentCredential, AgentJoinToken, Node

CREDENTIAL_TOUCH_SECONDS = 60  # last_used_at is a hint for admins: one write a minute per node is plenty
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


@transaction.atomic
def agent_register(*, join_token: str, hostname: str, agent_version: str, now=None) -> Registration:
    """Trade a join token for a node credential; the same hostname again gets the same node and a new credential
    (the old one is revoked: its agent lost its state or the machine was reinstalled)."""
    now = now or timezone.now()
    if not HOSTNAME_RE.match(hostname):
        raise ApplicationError(
            f"Invalid hostname {hostname[:60]!r}.", errors={"hostname": ["Letters, digits, '-', '_' and '.' only."]}
        )
    token = _usable_join_token(join_token, now)
    used = (
        AgentJoinToken.objects.filter(pk=token.pk, revoked_at__isnull=True, expires_at__gt=now)
        .filter(Q(max_uses__isnull=True) | Q(uses__lt=F("max_uses")))
        .update(uses=F("uses") + 1, last_used_at=now)
    )
    if not used:
        raise ApplicationError(
            f"Join token {token.name} is used up: it allowed {token.max_uses} registration(s).", status=403
        )
    node, created = Node.objects.select_for_update().get_or_create(
        cluster=token.cluster,
        name=hostname,
        defaults={"agent_version": agent_version[:50], "config_state_since": now},
    )
    revoked = AgentCredential.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
    plain, key_id, secret_hash = secret_new(CREDENTIAL_PREFIX)
    AgentCredential.objects.create(node=node, join_token=token, key_id=key_id, secret_hash=secret_hash)
    # A re-registered agent may have lost its applied state: its next report is recorded in full.
    Node.objects.filter(pk=node.pk).update(agent_version=agent_version[:50], agent_report_hash="", gone_at=None)
    audit_record(
        actor=Actor.system("tessera-agent"),
        action="node.agent_register",
        obj=node,
        after={"join_token": token.name, "agent_version": agent_version[:50], "new_node": created},
        message="re-registered; the previous credential is revoked" if revoked else "",
        now=now,
    )
    return Registration(node=node, credential=plain, interval_seconds=agent_interval_seconds())


def agent_credential_authenticate(*, credential: str, now=None) -> AgentCredential | None:
    """The active credential this bearer secret belongs to, or None. It comes with its node (the fields the agent
    services read; others load on access) and `serving_change`: (pk, config id) of the change the node should
    apply now, or None, read by the same statement (`agent_report_record` takes it)."""
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
    return found
