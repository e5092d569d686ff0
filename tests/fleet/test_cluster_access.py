"""An admin cannot make the worker read any file or fetch any URL: kubeconfigs come from the configured directory,
credential plugins that run commands need a setting, metrics URLs need an allowed host (issue 15, point 7)."""

import http.server
import threading

import pytest
from django.urls import reverse

from fleet.cluster_access import AccessRefused, checked_metrics_url
from tests.factories import ClusterFactory, UserFactory
from worker.drivers.base import DriverError
from worker.drivers.kubernetes.api import api_client, forget_client
from worker.inventory.exporters import fetch_metrics

pytestmark = pytest.mark.django_db

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: USER}]
"""
EXEC_USER = "{exec: {apiVersion: client.authentication.k8s.io/v1, command: touch, args: [MARKER]}}"


@pytest.fixture
def kubeconfigs(tmp_path, settings):
    """The configured kubeconfig directory, with a plain kubeconfig in it; a secret file lies outside it."""
    directory = tmp_path / "kubeconfigs"
    directory.mkdir()
    (directory / "east.yaml").write_text(KUBECONFIG.replace("USER", "{token: t0ken}"))
    (tmp_path / "outside.yaml").write_text(KUBECONFIG.replace("USER", "{token: t0ken}"))
    settings.TESSERA = {**settings.TESSERA, "KUBECONFIG_DIR": str(directory), "METRICS_URL_ALLOW": ["*.svc"]}
    return directory


def create(api, **values):
    return api.post("/api/v1/clusters/", {"name": "east", "driver": "kubernetes", **values}, format="json")


def test_a_kubeconfig_in_the_directory_by_name_or_absolute_path(admin_api, kubeconfigs):
    assert create(admin_api, kubeconfig_path="east.yaml").status_code == 201
    assert create(admin_api, name="west", kubeconfig_path=str(kubeconfigs / "east.yaml")).status_code == 201


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.yaml", "/proc/self/environ"])
def test_a_file_outside_the_directory_is_refused(admin_api, kubeconfigs, path):
    response = create(admin_api, kubeconfig_path=path)
    assert response.status_code == 400
    (message,) = response.json()["errors"]["kubeconfig_path"]
    assert "directory" in message and path not in response.content.decode()


def test_a_symlink_out_of_the_directory_is_refused(admin_api, kubeconfigs):
    (kubeconfigs / "link.yaml").symlink_to(kubeconfigs.parent / "outside.yaml")
    assert "kubeconfig_path" in create(admin_api, kubeconfig_path="link.yaml").json()["errors"]


def test_credential_plugins_are_refused_unless_allowed(admin_api, kubeconfigs, settings):
    (kubeconfigs / "exec.yaml").write_text(KUBECONFIG.replace("USER", EXEC_USER))
    cmd_path = "{auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}}"
    (kubeconfigs / "gcp.yaml").write_text(KUBECONFIG.replace("USER", cmd_path))
    for name in ("exec.yaml", "gcp.yaml"):
        response = create(admin_api, kubeconfig_path=name)
        assert response.status_code == 400 and "exec" in response.json()["errors"]["kubeconfig_path"][0]
    settings.TESSERA = {**settings.TESSERA, "KUBECONFIG_ALLOW_EXEC": True}
    assert create(admin_api, kubeconfig_path="exec.yaml").status_code == 201


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:8000/admin/",
        "file:///etc/passwd",
        "gopher://x.svc/",
    ],
)
def test_metrics_urls_need_an_allowed_host(admin_api, kubeconfigs, url):
    response = create(admin_api, kubeconfig_path="east.yaml", metrics_url=url)
    assert response.status_code == 400 and "metrics_url" in response.json()["errors"]


def test_allowed_metrics_hosts_by_pattern_and_network(admin_api, kubeconfigs, settings):
    url = "http://dcgm-exporter.gpu-operator.svc:9400/metrics"
    assert create(admin_api, kubeconfig_path="east.yaml", metrics_url=url).status_code == 201
    settings.TESSERA = {**settings.TESSERA, "METRICS_URL_ALLOW": ["10.0.0.0/8"]}
    assert create(admin_api, name="b", kubeconfig_path="east.yaml", metrics_url="http://10.1.2.3/m").status_code == 201
    assert create(admin_api, name="c", kubeconfig_path="east.yaml", metrics_url="http://11.1.2.3/m").status_code == 400


def test_the_django_admin_refuses_them_beside_the_fields(client, kubeconfigs):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    data = {"name": "east", "driver": "kubernetes", "operator_namespace": "gpu-operator"}
    data |= {"kubeconfig_path": "/etc/passwd", "metrics_url": "http://169.254.169.254/"}
    form = client.post(reverse("admin:fleet_cluster_add"), data).context["adminform"].form
    assert set(form.errors) == {"kubeconfig_path", "metrics_url"}


# --- the worker checks again when it reads or fetches ---------------------------------------------------------------


def test_the_worker_refuses_a_kubeconfig_outside_the_directory(kubeconfigs):
    cluster = ClusterFactory(kubeconfig_path=str(kubeconfigs.parent / "outside.yaml"))  # saved before the rule
    with pytest.raises(DriverError) as caught:
        api_client(cluster)
    assert "directory" in str(caught.value) and "outside" not in str(caught.value)


def test_the_worker_never_runs_a_credential_plugin_unless_allowed(kubeconfigs, tmp_path):
    marker = tmp_path / "plugin-ran"
    (kubeconfigs / "exec.yaml").write_text(KUBECONFIG.replace("USER", EXEC_USER.replace("MARKER", str(marker))))
    cluster = ClusterFactory(kubeconfig_path="exec.yaml")
    with pytest.raises(DriverError) as caught:
        api_client(cluster)
    assert "exec" in str(caught.value) and not marker.exists()


def test_the_worker_loads_a_kubeconfig_of_the_directory(kubeconfigs):
    cluster = ClusterFactory(kubeconfig_path="east.yaml")
    assert api_client(cluster).configuration.host == "https://127.0.0.1:1"
    forget_client(cluster.pk)


class _Redirect(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_worker_refuses_a_metrics_url_no_longer_allowed_and_follows_no_redirect(kubeconfigs, settings):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cluster = ClusterFactory(kubeconfig_path="east.yaml", metrics_url=f"http://127.0.0.1:{server.server_port}/m")
    try:
        with pytest.raises(DriverError, match="refused"):
            fetch_metrics(cluster)
        settings.TESSERA = {**settings.TESSERA, "METRICS_URL_ALLOW": ["127.0.0.1"]}
        with pytest.raises(DriverError, match="answered 302"):
            fetch_metrics(cluster)
    finally:
        server.shutdown()
        forget_client(cluster.pk)


# --- URLs are checked with the parser that fetches them (issue 25, point 2) -----------------------------------------

# Forms on which urllib.parse and urllib3 (which fetches) read a different host, or which hide the host they name.
DIFFERENTIAL_URLS = [
    "http://169.254.169.254\\@x.svc/latest/",  # backslash: urllib.parse sees x.svc, urllib3 connects to 169.254…
    "http:\\\\x.svc/",
    "http://x.svc@169.254.169.254/",  # userinfo
    "http://user:pass@x.svc/",
    "http://169.254.169.254;@x.svc/",
    "http://169.254.169.254\t@x.svc/",  # urllib.parse drops the tab, urllib3 keeps it
    "http://x.svc\t/",
    "http://x.svc /",
    "http://x.svc/\r\nHost: 169.254.169.254",
    "http://x.svc\x00/",
    "http://x%2esvc/",  # percent-encoding: urllib3 decodes the host, urllib.parse does not
    "http://169.254.169.254%23.svc/",
    "http://[fe80::1%25eth0]/",  # IPv6 zone id
    "http://x.svc./",  # trailing dot
    "http://2852039166/",  # 169.254.169.254 as inet_aton reads it
    "http://0251.0376.0251.0376/",
    "http://0xa9fea9fe/",
    "http://10.0.0.010/",
    "http://x.svc:80:81/",
    "http://x.sv\u0441/",  # a Cyrillic letter
    "http://[::ffff:169.254.169.254]/",
]


@pytest.fixture
def allow(settings, kubeconfigs):
    settings.TESSERA = {**settings.TESSERA, "METRICS_URL_ALLOW": ["*.svc", "10.0.0.0/8", "fe80::/10"]}


@pytest.mark.parametrize("field", ["metrics_url", "prometheus_url"])
@pytest.mark.parametrize("url", DIFFERENTIAL_URLS)
def test_urls_parsers_read_differently_are_refused_per_field(admin_api, allow, field, url):
    response = create(admin_api, kubeconfig_path="east.yaml", **{field: url})
    assert response.status_code == 400, url
    assert set(response.json()["errors"]) == {field}


def test_a_plain_url_is_fetched_as_checked_whatever_its_case(allow):
    assert (
        checked_metrics_url("HTTP://DCGM.GPU-Operator.SVC:9400/metrics") == "http://dcgm.gpu-operator.svc:9400/metrics"
    )
    assert checked_metrics_url("http://10.1.2.3/m?a=1#x") == "http://10.1.2.3/m?a=1"
    assert checked_metrics_url("http://[fe80::1]:9400/m") == "http://[fe80::1]:9400/m"
    with pytest.raises(AccessRefused):  # the API trims it; the worker refuses it
        checked_metrics_url(" http://x.svc/")


class _Listener(http.server.BaseHTTPRequestHandler):
    """Answers DCGM metrics and records that it was asked."""

    hits: list[str] = []

    def do_GET(self):
        self.hits.append(self.path)
        body = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",Hostname="n1"} 40\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("field", ["metrics_url", "prometheus_url"])
@pytest.mark.parametrize(
    "form", ["http://127.0.0.1:PORT\\@x.svc/m", "http://127.0.0.1:PORT\t@x.svc/m", "http://x.svc@127.0.0.1:PORT/m"]
)
def test_the_worker_never_contacts_a_host_hidden_behind_an_allowed_one(allow, field, form):
    """Saved before the rule (or behind the API's back), the URL is refused again when fetched: the listener on
    loopback, which `*.svc` does not allow, is never contacted."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Listener)
    _Listener.hits = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cluster = ClusterFactory(kubeconfig_path="east.yaml", **{field: form.replace("PORT", str(server.server_port))})
    try:
        with pytest.raises(DriverError, match="refused"):
            fetch_metrics(cluster)
    finally:
        server.shutdown()
        forget_client(cluster.pk)
    assert _Listener.hits == []
