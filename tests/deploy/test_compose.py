"""docker-compose.yml runs migrations first and everything else after them, exactly one beat and exactly one cluster
watcher (issue 19, point 1). Where the Docker Compose plugin is installed the file is read through `docker compose
config` (which validates it and resolves anchors as Compose does); elsewhere through YAML, which resolves the same
anchors and merge keys."""

import json
import shutil
import subprocess

import yaml

from tests.deploy.manifests import ROOT

COMPOSE = ROOT / "docker-compose.yml"
TESSERA = {"migrate", "web", "worker", "beat", "watcher"}


def _compose_plugin() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def _services() -> dict:
    plugin = _compose_plugin()
    if plugin is None:
        return yaml.safe_load(COMPOSE.read_text())["services"]
    result = subprocess.run(
        [*plugin, "-f", str(COMPOSE), "config", "--format", "json"],
        capture_output=True,
        text=True,
        env={"DJANGO_SECRET_KEY": "validation-only", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def _command(service: dict) -> str:
    return " ".join(service["command"])


def test_services_and_their_commands():
    services = _services()
    assert set(services) == TESSERA | {"postgres", "redis"}
    assert _command(services["migrate"]) == "python manage.py migrate --noinput"
    assert _command(services["watcher"]) == "python manage.py watch_clusters"
    assert _command(services["beat"]).startswith("celery -A config beat")
    assert services["migrate"]["restart"] == "no"  # runs once; a failure stops what waits for it
    for name in TESSERA:
        assert services[name]["image"] == "tessera:latest" and "DJANGO_SECRET_KEY" in services[name]["environment"]


def test_web_worker_beat_and_watcher_start_after_the_migrations_finished():
    services = _services()
    for name in TESSERA - {"migrate"}:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["postgres"]["condition"] == "service_healthy", name
    assert set(services["migrate"]["depends_on"]) == {"postgres"}


def test_exactly_one_beat_and_one_watcher():
    services = _services()
    for name in ("beat", "watcher"):
        assert (services[name].get("deploy") or {}).get("replicas", 1) == 1, name
        assert "ports" not in services[name]
    runs = {name for name, s in services.items() if "command" in s and "watch_clusters" in _command(s)}
    assert runs == {"watcher"}
    assert {name for name, s in services.items() if "command" in s and " beat" in _command(s)} == {"beat"}
