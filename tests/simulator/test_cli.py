"""`python -m simulator`: one line with the URL and kubeconfig, a working API, a clean stop on SIGTERM."""

import re
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]


def test_help_explains_every_flag():
    result = subprocess.run(
        [sys.executable, "-m", "simulator", "--help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    for flag in (
        "--port", "--host", "--nodes", "--seed", "--write-kubeconfig", "--apply-delay", "--latency-ms",
        "--error-rate", "--write-error-rate", "--workload-pods", "--mig-strategy", "--mig-config-source",
        "--watch-history", "--token", "--state-dir", "--log-requests", "--watch-drop-after-events",
        "--watch-drop-after-seconds", "--faults", "--fresh", "--save-interval",
    ):  # fmt: skip
        assert flag in result.stdout


def test_serves_until_sigterm(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", "0", "--nodes", "4", "--seed", "3"]
        + ["--write-kubeconfig", str(kubeconfig), "--faults", '{"failing_nodes": ["gpu-node-0001"]}'],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        match = re.search(r"serving (https://127\.0\.0\.1:\d+) kubeconfig=(\S+)", line)
        assert match, line
        assert match.group(2) == str(kubeconfig)
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        assert len(core.list_node().items) == 4
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
