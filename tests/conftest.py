"""Shared fixtures: users per role, API clients, a simulated Kubernetes cluster, and Playwright's Chromium
(Debian's, never a download)."""

import os
from dataclasses import dataclass

import pytest
import requests
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from simulator import Simulator
from tests.factories import ClusterFactory, UserFactory

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


def parse_metrics(text: str) -> dict:
    """Prometheus text as {sample name: {sorted label items: value}} (suffixes such as _total kept in the name)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


@pytest.fixture
def scrape(client, django_user_model):
    """GET /metrics through the test client as a signed-in viewer (anonymous callers need the metrics token),
    parsed by parse_metrics."""
    from tests.factories import UserFactory

    scraper = django_user_model.objects.filter(username="metrics-scraper").first() or UserFactory(
        username="metrics-scraper", role="viewer"
    )

    def get() -> dict:
        client.force_login(scraper)
        response = client.get("/metrics")
        assert response.status_code == 200
        return parse_metrics(response.content.decode())

    return get


@pytest.fixture
def sim_options() -> dict:
    """How `sim` starts the simulator, beyond its defaults; a test module overrides this fixture to change it."""
    return {}


@pytest.fixture
def sim(sim_options):
    """A simulated Kubernetes cluster with the GPU Operator (a child process): 12 seeded nodes, changes applied at
    once, no workload pods unless `sim_options` asks for them."""
    options = {"nodes": 12, "seed": 7, "apply_delay": 0.0, "workload_pods": 0, **sim_options}
    with Simulator(**options) as simulator:
        yield simulator


@pytest.fixture
def core(sim):
    """The official client's CoreV1Api on the simulator, to change or read it behind Tessera's back."""
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def custom(sim):
    """The official client's CustomObjectsApi on the simulator (Kueue's objects, the ClusterPolicy)."""
    with config.new_client_from_config(config_file=sim.kubeconfig_path) as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture
def sim_cluster(sim):
    """A Kubernetes cluster in Tessera pointing at the simulator: its API and its dcgm-exporter metrics (needs a
    database: the test's django_db mark)."""
    return ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path, metrics_url=f"{sim.url}/metrics")


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


@dataclass
class OidcProvider:
    """oidc-provider-mock serving a real OpenID provider over HTTP on loopback: discovery, an authorization form (type
    a subject, press Authorize), tokens signed with RS256, userinfo, JWKS and RP-initiated logout."""

    url: str

    def set_user(self, sub: str, **claims) -> None:
        """The claims the provider gives `sub` from its next sign-in on (userinfo and ID token)."""
        requests.put(f"{self.url}/users/{sub}", json=claims, timeout=5).raise_for_status()


SSO_ROLE_MAP = "tessera-admins=admin,tessera-ops=operator,everyone=viewer"


@pytest.fixture
def oidc_provider():
    import oidc_provider_mock  # Flask and authlib only for the tests that run a provider

    with oidc_provider_mock.run_server_in_thread(require_nonce=True) as server:
        yield OidcProvider(f"http://localhost:{server.server_port}")


@pytest.fixture
def sso(settings, oidc_provider):
    """Tessera configured for `oidc_provider` as the environment would (TESSERA_OIDC_*): discovery from its issuer,
    `groups` mapped by SSO_ROLE_MAP, and the sign-out form allowed to go to it."""
    from core.sso import forget_provider

    settings.OIDC_RP_CLIENT_ID = "tessera"
    settings.OIDC_RP_CLIENT_SECRET = "client-secret-for-tests"
    settings.TESSERA_SSO = {
        **settings.TESSERA_SSO,
        "ISSUER": oidc_provider.url,
        "PROVIDER_NAME": "Example ID",
        "ROLES_CLAIM": "groups",
        "ROLE_MAP": SSO_ROLE_MAP,
    }
    policy = settings.CONTENT_SECURITY_POLICY
    directives = {**policy["DIRECTIVES"], "form-action": [*policy["DIRECTIVES"]["form-action"], oidc_provider.url]}
    settings.CONTENT_SECURITY_POLICY = {**policy, "DIRECTIVES": directives}
    forget_provider()
    yield oidc_provider
    forget_provider()
