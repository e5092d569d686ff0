"""`python -m agent` as a process: no driver (for real, on this driverless machine), simulated GPUs, signals."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from agent.protocol import DesiredConfig
from tests.agent.conftest import JOIN_TOKEN, mig_settings

ROOT = Path(__file__).resolve().parents[2]


def agent_command(*args):
    return [sys.executable, "-m", "agent", *args]


def environment(**extra):
    """This environment without TESSERA_* settings, plus TESSERA_INSECURE_LAB=1: the fake server speaks http://."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TESSERA_")}
    return {**env, "TESSERA_INSECURE_LAB": "1", **extra}


def run_agent(*args, **extra_env):
    return subprocess.run(
        agent_command(*args), cwd=ROOT, env=environment(**extra_env), capture_output=True, text=True, timeout=30
    )


def has_nvml():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(has_nvml(), reason="this host has an NVIDIA driver")
def test_without_a_driver_the_agent_says_so_in_one_line_and_exits_2():
    result = run_agent("--server", "http://127.0.0.1:9", "--join-token", "x", "--once")
    assert result.returncode == 2
    assert result.stderr == (
        "no NVIDIA driver (NVML library not found) on this host; use --simulate to run with simulated GPUs\n"
    )
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_simulated_node_registers_reports_and_applies(fake_server, tmp_path):
    fake_server.desired = DesiredConfig("cfg-a", 5, mig=mig_settings({"1g.10gb": 7}))
    token_file = tmp_path / "join-token"
    token_file.write_text(JOIN_TOKEN + "\n")
    result = run_agent(
        "--server", fake_server.url, "--join-token-file", str(token_file), "--state-dir", str(tmp_path / "state"),
        "--simulate", "--seed", "42", "--product", "NVIDIA-A100-SXM4-80GB", "--gpus", "4", "--once", "--no-workload",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert [r.hostname for r in fake_server.registrations] == ["sim-node-42"]
    (report,) = fake_server.reports
    assert [gpu.product for gpu in report.gpus] == ["NVIDIA-A100-SXM4-80GB"] * 4
    (outcome,) = fake_server.outcomes
    assert outcome.status == "succeeded" and outcome.report.applied.config_id == "cfg-a"
    assert "config cfg-a (change 5) succeeded" in result.stderr
    assert JOIN_TOKEN not in result.stderr and "cred-1-b7d01e" not in result.stderr


def test_settings_come_from_the_environment_and_a_revoked_credential_exits_3(fake_server, tmp_path):
    (tmp_path / "sa-token").write_text("projected-sa-token")
    env = {"TESSERA_SERVER": fake_server.url, "TESSERA_JOIN_TOKEN": JOIN_TOKEN, "TESSERA_HOSTNAME": "gpu-node-7",
           "TESSERA_SERVICE_ACCOUNT_TOKEN_FILE": str(tmp_path / "sa-token")}  # fmt: skip
    state = ["--state-dir", str(tmp_path / "state"), "--simulate", "--gpus", "1", "--once"]
    assert run_agent(*state, **env).returncode == 0
    assert fake_server.registrations[0].hostname == "gpu-node-7" and fake_server.reports[0].hostname == "gpu-node-7"
    assert fake_server.registrations[0].service_account_token == "projected-sa-token"

    fake_server.revoke_all()
    result = run_agent(*state, **env)
    assert result.returncode == 3
    assert "the server refused the agent credential: Agent credential revoked or unknown." in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_stops_the_loop_cleanly(fake_server, tmp_path):
    process = subprocess.Popen(
        agent_command(
            "--server",
            fake_server.url,
            "--join-token",
            JOIN_TOKEN,
            "--state-dir",
            str(tmp_path / "state"),
            "--simulate",
            "--gpus",
            "1",
            "--interval",
            "0.1",
        ),  # fmt: skip
        cwd=ROOT,
        env=environment(),
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 15
    while len(fake_server.reports) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    assert len(fake_server.reports) >= 2 and "Traceback" not in process.stderr.read()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--join-token", "x"], "--server (or TESSERA_SERVER) is required"),
        (["--server", "https://x", "--simulate", "--product", "NVIDIA-H100"], "did you mean"),
        (["--server", "https://x", "--simulate", "--gpus", "0"], "--gpus must be 1 to 16"),
        (["--server", "https://x", "--join-token-file", "/nonexistent/token"], "cannot read the join token file"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args, message):
    result = run_agent(*args)
    assert result.returncode == 2 and message in result.stderr


def test_an_http_server_url_is_refused_unless_the_agent_is_told_it_is_a_lab(fake_server, tmp_path):
    state = ["--state-dir", str(tmp_path / "state"), "--simulate", "--gpus", "1", "--once"]
    for args, env in (
        (["--server", fake_server.url, "--join-token", JOIN_TOKEN], {"TESSERA_INSECURE_LAB": ""}),
        ([], {"TESSERA_SERVER": fake_server.url, "TESSERA_JOIN_TOKEN": JOIN_TOKEN, "TESSERA_INSECURE_LAB": "0"}),
    ):
        refused = run_agent(*args, *state, **env)
        assert refused.returncode == 2 and "refusing the plain-HTTP server URL" in refused.stderr
        assert "--insecure-lab" in refused.stderr and fake_server.registrations == []
    allowed = run_agent("--server", fake_server.url, "--join-token", JOIN_TOKEN, "--insecure-lab", *state)
    assert allowed.returncode == 0 and len(fake_server.registrations) == 1


def test_a_state_directory_that_cannot_be_used_stops_the_agent_before_it_registers(fake_server, tmp_path):
    (tmp_path / "file").write_text("")
    state = str(tmp_path / "file" / "state")
    result = run_agent("--server", fake_server.url, "--join-token", "x", "--state-dir", state, "--simulate", "--once")
    assert result.returncode == 2 and "cannot use the state directory" in result.stderr
    assert "Traceback" not in result.stderr and fake_server.registrations == []
