"""API tokens: shown once and never cached, stored only as a hash, expiring; tokens of DRF's table migrated by
hashing (issue 15, point 8)."""

import importlib
import io
from datetime import timedelta
from types import SimpleNamespace

import pytest
import time_machine
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from core.models import ApiToken
from core.services import api_token_rotate

pytestmark = pytest.mark.django_db


def me(token: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client.get("/api/v1/me/").status_code


def test_the_token_page_shows_a_token_once_and_is_never_cached(client, viewer):
    client.force_login(viewer)
    empty = client.get("/account/token/")
    assert "no-store" in empty["Cache-Control"] and "no API token yet" in empty.content.decode()
    made = client.post("/account/token/")
    assert made.status_code == 200 and "no-store" in made["Cache-Control"]
    plain = made.context["plain"]
    assert plain.startswith("tst_") and plain in made.content.decode() and me(plain) == 200
    again = client.get("/account/token/")
    assert plain not in again.content.decode() and ApiToken.objects.get(user=viewer).key_id in again.content.decode()
    rotated = client.post("/account/token/").context["plain"]
    assert rotated != plain and me(plain) == 401 and me(rotated) == 200


def test_a_database_dump_holds_no_usable_token(viewer):
    _, plain = api_token_rotate(user=viewer)
    secret = plain.rsplit("_", 1)[1]
    dump = io.StringIO()
    call_command("dumpdata", stdout=dump)
    assert secret not in dump.getvalue() and plain not in dump.getvalue()
    with connection.cursor() as cursor:
        cursor.execute("SELECT key_id, secret_hash FROM core_apitoken")
        (key_id, stored), *_ = cursor.fetchall()
    assert me(f"tst_{key_id}_{stored}") == 401  # the stored hash is no token


def test_tokens_expire_after_the_configured_days(viewer, settings):
    settings.TESSERA = {**settings.TESSERA, "API_TOKEN_DAYS": 30}
    token, plain = api_token_rotate(user=viewer)
    assert token.expires_at - token.created_at == timedelta(days=30)
    with time_machine.travel(timezone.now() + timedelta(days=29)):
        assert me(plain) == 200
    with time_machine.travel(timezone.now() + timedelta(days=31)):
        assert me(plain) == 401
    settings.TESSERA = {**settings.TESSERA, "API_TOKEN_DAYS": 0}
    assert api_token_rotate(user=viewer)[0].expires_at is None


def test_a_wrong_secret_or_unknown_shape_is_refused(viewer):
    _, plain = api_token_rotate(user=viewer)
    for wrong in (plain[:-1] + ("A" if plain[-1] != "A" else "B"), "tst_000000000000_" + "x" * 43, "x" * 40, "é"):
        assert me(wrong) == 401


def test_tokens_of_drfs_table_are_hashed_and_keep_working(viewer, settings):
    """The data migration, on a table as DRF's authtoken app left it."""
    settings.TESSERA = {**settings.TESSERA, "API_TOKEN_DAYS": 90}
    key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamp, user_id integer)")
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, %s, %s)", [key, timezone.now(), viewer.pk])
    migration = importlib.import_module("core.migrations.0003_api_token")
    # The schema editor's two uses there (SQLite's refuses to open inside the test's transaction).
    editor = SimpleNamespace(connection=connection, execute=lambda sql: connection.cursor().execute(sql))
    migration.hash_drf_tokens(apps, editor)
    assert "authtoken_token" not in connection.introspection.table_names()
    token = ApiToken.objects.get(user=viewer)
    assert key not in token.secret_hash and token.expires_at is not None
    assert me(key) == 200
