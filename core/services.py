"""Writes of the core app: API tokens."""

from django.db import transaction
from rest_framework.authtoken.models import Token


def api_token_get_or_create(*, user) -> Token:
    token, _ = Token.objects.get_or_create(user=user)
    return token


@transaction.atomic
def api_token_rotate(*, user) -> Token:
    """Replace the user's token; the old key is invalid from this commit on."""
    Token.objects.filter(user=user).delete()
    return Token.objects.create(user=user)
