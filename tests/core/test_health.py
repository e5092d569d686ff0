import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import GpuFactory

pytestmark = pytest.mark.django_db


def test_healthz_and_readyz(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["database"] == "ok"


def test_metrics_exposes_fleet_gauges(client, viewer):
    client.force_login(viewer)
    GpuFactory(product="NVIDIA-A30", health="unhealthy")
    text = client.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {tuple(sorted(s.labels.items())): s.value for s in families["tessera_gpus"].samples}
    assert samples[(("health", "unhealthy"), ("product", "NVIDIA-A30"))] == 1
    assert "tessera_nodes_stale" in families
