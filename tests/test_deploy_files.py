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
