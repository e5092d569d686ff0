"""Sign-ins are locked out per account and per address after repeated failures, visibly to an admin who can clear
them; passwords meet Django's full set of validators, TESSERA_ADMIN_PASSWORD included; a generated admin password
is shown once on a terminal and never written into a log (issue 15, point 5)."""

import io
import stat

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.test import Client

from console.management.commands.run_embedded import Command as RunEmbedded
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
PASSWORD = "pw-for-tests-1"  # tests.factories.UserFactory's


def sign_in(username, password, address="10.0.0.1", path="/login/", **headers):
    client = Client(REMOTE_ADDR=address, **headers)
    return client.post(path, {"username": username, "password": password})


def signed_in(response) -> bool:
    return response.status_code == 302


def test_an_account_is_locked_after_five_failures_from_anywhere(viewer):
    for i in range(4):
        assert sign_in("viewer", f"wrong-{i}", address=f"10.0.0.{i}").status_code == 200
    assert sign_in("viewer", "wrong-5", address="10.0.0.5").status_code == 429  # the fifth locks
    locked = sign_in("viewer", PASSWORD, address="10.9.9.9")
    assert locked.status_code == 429 and "Sign-in locked" in locked.content.decode()
    assert signed_in(sign_in("operator-x", "x", address="10.9.9.9")) is False  # others are not locked out by it
    UserFactory(username="other", role="viewer")
    assert signed_in(sign_in("other", PASSWORD, address="10.9.9.9"))


def test_an_address_is_locked_after_five_failures_whatever_the_names(viewer):
    for i in range(5):
        sign_in(f"guess-{i}", "password", address="10.0.0.66")
    assert sign_in("viewer", PASSWORD, address="10.0.0.66").status_code == 429
    assert signed_in(sign_in("viewer", PASSWORD, address="10.0.0.67"))


def test_a_forwarded_for_header_written_by_the_client_does_not_escape_the_lockout(viewer):
    for i in range(5):
        sign_in(f"guess-{i}", "password", address="10.0.0.66", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
    assert sign_in("viewer", PASSWORD, address="10.0.0.66", HTTP_X_FORWARDED_FOR="192.0.2.99").status_code == 429


def test_the_django_admin_sign_in_is_locked_out_too(admin_user):
    for i in range(5):
        sign_in("admin", f"wrong-{i}", path="/admin/login/")
    assert sign_in("admin", PASSWORD, path="/admin/login/").status_code == 429


def test_a_lockout_is_shown_to_an_admin_who_clears_it(client, viewer):
    for i in range(5):
        sign_in("viewer", f"wrong-{i}")
    assert sign_in("viewer", PASSWORD).status_code == 429
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    listing = client.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200 and "viewer" in listing.content.decode()
    from axes.models import AccessAttempt

    for attempt in AccessAttempt.objects.all():
        delete = f"/admin/axes/accessattempt/{attempt.pk}/delete/"
        assert client.post(delete, {"post": "yes"}).status_code == 302
    assert signed_in(sign_in("viewer", PASSWORD))


def test_a_success_before_the_limit_starts_the_count_again(viewer):
    for i in range(4):
        sign_in("viewer", f"wrong-{i}")
    assert signed_in(sign_in("viewer", PASSWORD))
    for i in range(4):
        sign_in("viewer", f"wrong-{i}")
    assert signed_in(sign_in("viewer", PASSWORD))


@pytest.mark.parametrize("password", ["short-1", "password1234", "84736251908374", "viewer-viewer"])
def test_passwords_meet_djangos_full_set_of_validators(password):
    with pytest.raises(ValidationError):
        validate_password(password, get_user_model()(username="viewer-viewer"))


# --- the first admin of `make run` ----------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self):
        return True


def ensure_admin(stdout) -> str:
    return RunEmbedded(stdout=stdout)._ensure_admin()


def test_a_weak_admin_password_from_the_environment_is_refused(monkeypatch):
    monkeypatch.setenv("TESSERA_ADMIN_PASSWORD", "admin123")
    with pytest.raises(CommandError) as refused:
        ensure_admin(io.StringIO())
    assert "TESSERA_ADMIN_PASSWORD refused" in str(refused.value) and "too short" in str(refused.value)
    assert not get_user_model().objects.exists()


def test_a_generated_admin_password_is_shown_on_a_terminal(monkeypatch):
    monkeypatch.delenv("TESSERA_ADMIN_PASSWORD", raising=False)
    line = ensure_admin(Terminal())
    password = line.split(" / ")[1].split()[0]
    assert get_user_model().objects.get(username="admin").check_password(password)


def test_a_generated_admin_password_never_goes_into_a_log(monkeypatch, settings, tmp_path):
    monkeypatch.delenv("TESSERA_ADMIN_PASSWORD", raising=False)
    settings.VAR_DIR = tmp_path
    log = io.StringIO()  # stdout redirected to a file, a pipe or a service manager's journal
    line = ensure_admin(log)
    secret_file = tmp_path / "admin-password"
    password = secret_file.read_text().strip()
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert password not in line and str(secret_file) in line
    assert get_user_model().objects.get(username="admin").check_password(password)
