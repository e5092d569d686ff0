"""Writes of the core app: users' API tokens, of which only a hash is stored.

A token reads `tst_<key id>_<secret>`: the key id finds the row, the SHA-256 of the secret is compared in constant
time. Tokens issued before hashing (DRF's 40 hex digits) were migrated as key id = their first 12 digits and hash of
the whole key (core/migrations/0003), and keep working until they expire or are rotated.
"""

import hashlib
import hmac
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.audit import Actor, audit_record
from core.models import ApiToken

PREFIX = "tst"
_SHAPE = re.compile(rf"{PREFIX}_([0-9a-f]{{12}})_([A-Za-z0-9_-]{{20,100}})")
_MIGRATED = re.compile(r"[0-9a-f]{40}")
_NO_HASH = "0" * 64  # compared against when no row matched, so a miss costs what a wrong secret costs


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _lifetime() -> timedelta | None:
    days = settings.TESSERA["API_TOKEN_DAYS"]
    return timedelta(days=days) if days else None


@transaction.atomic
def api_token_rotate(*, user, now=None) -> tuple[ApiToken, str]:
    """Give the user a new token (the old one stops working from this commit on); returns the row and the plain
    token, which is shown once and never stored."""
    now = now or timezone.now()
    ApiToken.objects.filter(user=user).delete()
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    lifetime = _lifetime()
    token = ApiToken.objects.create(
        user=user,
        key_id=key_id,
        secret_hash=token_hash(secret),
        created_at=now,
        expires_at=now + lifetime if lifetime else None,
    )
    audit_record(
        actor=Actor.for_user(user),
        action="api_token.rotate",
        obj=user,
        after={"key_id": key_id, "expires_at": token.expires_at.isoformat() if token.expires_at else None},
        now=now,
    )
    return token, f"{PREFIX}_{key_id}_{secret}"


def api_token_authenticate(plain: str, *, now=None) -> ApiToken | None:
    """The live token this plain text is, or None (unknown, wrong secret or expired)."""
    if match := _SHAPE.fullmatch(plain):
        key_id, secret = match.groups()
    elif _MIGRATED.fullmatch(plain):
        key_id, secret = plain[:12], plain
    else:
        return None
    token = ApiToken.objects.select_related("user").filter(key_id=key_id).first()
    if not hmac.compare_digest(token_hash(secret), token.secret_hash if token else _NO_HASH):
        return None
    if token.expires_at is not None and token.expires_at <= (now or timezone.now()):
        return None
    return token
