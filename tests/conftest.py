"""Shared fixtures: users per role, API clients, and Playwright's Chromium (Debian's, never a download)."""

import os

import pytest
from rest_framework.test import APIClient

from tests.factories import UserFactory

# Sync Playwright runs an event loop in the test thread; the ORM calls in browser tests are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("TESSERA_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture
def viewer(db):
    return UserFactory(username="viewer", role="viewer")


@pytest.fixture
def operator(db):
    return UserFactory(username="operator", role="operator")


@pytest.fixture
def admin_user(db):
    return UserFactory(username="admin", role="admin")


@pytest.fixture
def api_client():
    return APIClient()


def _client_for(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def viewer_api(viewer):
    return _client_for(viewer)


@pytest.fixture
def operator_api(operator):
    return _client_for(operator)


@pytest.fixture
def admin_api(admin_user):
    return _client_for(admin_user)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's Chromium with the flags that keep it off the (closed) network; see stack-notes."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's chromium (make test does, as root).")
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    }
