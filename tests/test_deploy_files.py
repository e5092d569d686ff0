"""The compose file is valid for Docker Compose (validated where a compose client is installed)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compose_command():
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("no Docker Compose client installed")


def test_compose_file_is_valid():
    result = subprocess.run(
        [*_compose_command(), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        env={"DJANGO_SECRET_KEY": "validation-only", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr


def _manifests():
    import yaml

    for path in sorted((ROOT / "deploy").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def test_manifests_are_well_formed_and_run_one_beat():
    docs = list(_manifests())
    assert docs
    for name, doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), name
        assert doc["metadata"].get("name"), name
    deployments = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Deployment"}
    assert set(deployments) >= {"tessera-web", "tessera-worker", "tessera-beat", "tessera-watcher"}
    assert deployments["tessera-beat"]["spec"]["replicas"] == 1


def test_rbac_grants_what_the_kubernetes_driver_does():
    rules = [r for _, d in _manifests() if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]

    def allowed(resource, verb):
        return any(resource in r["resources"] and verb in r["verbs"] for r in rules)

    for resource, verb in [
        ("nodes", "patch"),
        ("nodes", "watch"),
        ("pods/eviction", "create"),
        ("configmaps", "update"),
        ("clusterpolicies", "patch"),
        ("nodes/proxy", "get"),
        ("pods/proxy", "get"),
        ("services", "list"),
    ]:
        assert allowed(resource, verb), (resource, verb)
