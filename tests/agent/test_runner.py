"""The agent loop against a test double of the server: register, report, fetch, apply, outcome, and what fails."""

import json
import logging
import stat
import threading

import pytest

from agent.protocol import (
    DesiredConfig,
    GpuSettings,
    HostTuning,
    MpsSettings,
    NodeSettings,
    SafetySettings,
    TimeSliceSettings,
    inventory_digest,
    request_fingerprint,
)
from agent.runner import (
    CREDENTIAL_FILE,
    EXIT_AUTH,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Agent,
    AgentSettings,
    Credential,
    load_credential,
)
from tests.agent.conftest import JOIN_TOKEN, mig_settings

BALANCED = {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def make_agent(fake_server, make_backend, state_dir):
    def make(backend=None, *, join_token=JOIN_TOKEN, clock=None, stop=None, **settings):
        options = {"clock": clock} if clock else {}
        settings = AgentSettings(fake_server.url, state_dir, join_token, insecure_lab=True, **settings)
        return Agent(settings, backend or make_backend(), stop=stop, **options)

    return make


def test_register_report_fetch_apply_and_report_the_outcome(fake_server, make_agent, state_dir):
    fake_server.desired = DesiredConfig("cfg-a", 11, mig=mig_settings(BALANCED), persistence_mode=True)
    agent = make_agent(once=True)
    assert agent.run() == EXIT_OK

    (registration,) = fake_server.registrations
    assert (registration.hostname, registration.agent_version) == ("sim-node-0", "0.1.0")
    (report,) = fake_server.reports
    assert report.applied is None and len(report.gpus) == 2 and report.driver_version == "570.133.20"
    assert fake_server.desired_fetches == 1
    (outcome,) = fake_server.outcomes
    assert (outcome.change_id, outcome.config_id, outcome.status) == (11, "cfg-a", "succeeded")
    assert outcome.message == "MIG config layout on GPU 0, 1; persistence mode on"
    assert outcome.report.applied.config_id == "cfg-a" and outcome.report.applied.mig_selected == "layout"
    assert outcome.report.applied.persistence_mode is True
    assert [len(gpu.mig_devices) for gpu in outcome.report.gpus] == [4, 4]
    assert outcome.report.xid_events == ()
    assert agent.interval == 7  # what the server said at registration

    agent.cycle()  # in place: the next report says so and nothing is fetched
    assert fake_server.reports[-1].applied.config_id == "cfg-a"
    assert (fake_server.desired_fetches, len(fake_server.outcomes)) == (1, 1)


def test_the_credential_is_private_and_reused_on_restart(fake_server, make_agent, make_backend, state_dir):
    make_agent(once=True).run()
    path = state_dir / CREDENTIAL_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored["server"] == fake_server.url and stored["node_id"] == 1 and stored["credential"] == "cred-1-b7d01e"

    restarted = make_agent(make_backend(), join_token="ignored-when-a-credential-exists", once=True)
    assert restarted.run() == EXIT_OK
    assert len(fake_server.registrations) == 1 and len(fake_server.reports) == 2
    assert load_credential(state_dir, "http://another-server:8000") is None


def test_an_http_server_is_refused_before_the_join_token_is_sent(fake_server, make_backend, state_dir, caplog):
    settings = AgentSettings(fake_server.url, state_dir, JOIN_TOKEN, once=True)
    assert Agent(settings, make_backend()).run() == EXIT_USAGE
    assert "refusing the plain-HTTP server URL" in caplog.text and fake_server.registrations == []


def test_an_agent_registering_an_existing_node_waits_for_approval_with_one_key(
    fake_server, make_agent, state_dir, caplog
):
    fake_server.approval_needed.add("sim-node-0")
    assert make_agent(once=True).run() == EXIT_FAILED
    key = fake_server.registrations[0].request_key
    fingerprint = request_fingerprint(key)
    assert f"waiting for an admin to approve request {fingerprint} for node sim-node-0" in caplog.text
    assert key not in caplog.text and not (state_dir / "credential.json").exists()
    assert make_agent(once=True).run() == EXIT_FAILED  # restarted: the same request, not a new one
    assert fake_server.registrations[1].request_key == key
    fake_server.approved_keys.add(key)
    assert make_agent(once=True).run() == EXIT_OK
    assert (state_dir / "credential.json").exists() and not (state_dir / "request-key.json").exists()
    assert len(fake_server.reports) == 1


def test_the_service_account_token_is_read_at_each_registration(fake_server, make_agent, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("projected-token-1\n")
    assert make_agent(once=True, service_account_token_file=token_file).run() == EXIT_OK
    assert fake_server.registrations[0].service_account_token == "projected-token-1"


def test_rotating_presents_the_current_credential_and_keeps_the_new_one(fake_server, make_agent, state_dir):
    assert make_agent(once=True).run() == EXIT_OK
    old = json.loads((state_dir / "credential.json").read_text())["credential"]
    fake_server.approval_needed.add("sim-node-0")  # the node exists now: only its credential re-registers it
    assert make_agent(once=True, rotate_credential=True).run() == EXIT_OK
    rotation = fake_server.registrations[1]
    assert rotation.credential == old and rotation.request_key is None
    new = json.loads((state_dir / "credential.json").read_text())["credential"]
    assert new != old and old not in fake_server.credentials and len(fake_server.reports) == 2


def test_no_credential_and_no_join_token_is_a_usage_error(make_agent, caplog):
    assert make_agent(join_token=None, once=True).run() == EXIT_USAGE
    assert "no stored credential" in caplog.text


def test_a_revoked_credential_ends_the_agent_with_code_3(fake_server, make_agent, caplog):
    agent = make_agent()
    agent.cycle()
    fake_server.revoke_all()
    assert agent.run() == EXIT_AUTH
    assert "the server refused the agent credential: Agent credential revoked or unknown." in caplog.text


def test_a_rejected_join_token_ends_the_agent_with_code_3(make_agent, caplog):
    assert make_agent(join_token="join-wrong").run() == EXIT_AUTH
    assert "the server refused the join token: Join token expired or revoked." in caplog.text


def test_busy_gpus_and_policy_wait_refuse_the_change(fake_server, make_agent, make_backend):
    backend = make_backend()
    pid = backend.sim.start_process(0)
    fake_server.desired = DesiredConfig("cfg-a", 11, mig=mig_settings(BALANCED))
    agent = make_agent(backend)
    agent.cycle()
    (outcome,) = fake_server.outcomes
    assert outcome.status == "refused_busy"
    assert outcome.message == f"compute processes hold GPU 0 (pid {pid}); the safety policy is to wait"
    assert [gpu.mig_mode_current for gpu in outcome.report.gpus] == [False, False]  # nothing touched

    agent.cycle()  # the same change is not retried by the agent
    assert len(fake_server.outcomes) == 1

    backend.sim.stop_process(pid)
    fake_server.desired = DesiredConfig("cfg-a", 12, mig=mig_settings(BALANCED))  # the server retries
    agent.cycle()
    assert [o.status for o in fake_server.outcomes] == ["refused_busy", "succeeded"]


def test_policy_wait_waits_up_to_wait_seconds_while_reporting(fake_server, make_agent, make_backend):
    now = [1000.0]
    backend = make_backend()
    pid = backend.sim.start_process(1)
    safety = SafetySettings("wait", wait_seconds=60)
    fake_server.desired = DesiredConfig("cfg-a", 11, mig=mig_settings(BALANCED), safety=safety)
    agent = make_agent(backend, clock=lambda: now[0])
    agent.cycle()
    now[0] += 30
    agent.cycle()
    assert fake_server.outcomes == [] and len(fake_server.reports) == 2
    backend.sim.stop_process(pid)
    agent.cycle()
    assert [o.status for o in fake_server.outcomes] == ["succeeded"]

    backend.sim.start_process(0)
    fake_server.desired = DesiredConfig("cfg-b", 12, mig=mig_settings({"7g.80gb": 1}), safety=safety)
    agent.cycle()
    now[0] += 61
    agent.cycle()
    assert [o.status for o in fake_server.outcomes] == ["succeeded", "refused_busy"]


def test_policy_force_applies_anyway_and_nvml_in_use_is_still_busy(fake_server, make_agent, make_backend):
    backend = make_backend()
    backend.sim.start_process(0)
    fake_server.desired = DesiredConfig("cfg-a", 11, mig=mig_settings(BALANCED), safety=SafetySettings("force"))
    make_agent(backend).cycle()
    (outcome,) = fake_server.outcomes
    assert outcome.status == "refused_busy"
    assert outcome.message == "GPU 0: set MIG mode: the GPU is in use (NVML_ERROR_IN_USE)"


def test_an_invalid_layout_fails_with_the_validators_reason(fake_server, make_agent):
    fake_server.desired = DesiredConfig("cfg-a", 11, mig=mig_settings({"4g.40gb": 2}))
    make_agent().cycle()
    (outcome,) = fake_server.outcomes
    assert outcome.status == "failed"
    assert outcome.message == (
        "GPU 0, 1: NVIDIA-H100-80GB-HBM3 fits at most 1 × 4g.40gb; 4g.40gb × 2 asks for more; "
        "NVIDIA-H100-80GB-HBM3 has 7 compute slices; 4g.40gb × 2 needs 8"
    )


def test_mps_and_time_slicing_apply_and_undo(fake_server, make_agent, make_backend):
    backend = make_backend()
    agent = make_agent(backend)
    fake_server.desired = DesiredConfig(
        "cfg-mps", 1, mps=MpsSettings(replicas=4), time_slice=TimeSliceSettings("short")
    )
    agent.cycle()
    assert fake_server.outcomes[-1].status == "failed" and "mutually exclusive" in fake_server.outcomes[-1].message

    fake_server.desired = DesiredConfig("cfg-mps", 2, mps=MpsSettings(replicas=4))
    agent.cycle()
    assert fake_server.outcomes[-1].message == "MPS for 4 clients per GPU"
    assert backend.sim.mps.running and backend.sim.mps.active_thread_percentage == 25

    fake_server.desired = DesiredConfig("cfg-ts", 3, time_slice=TimeSliceSettings("medium"))
    agent.cycle()
    assert fake_server.outcomes[-1].message == "MPS stopped; time slice medium"
    assert not backend.sim.mps.running and [gpu.time_slice for gpu in backend.sim.gpus] == [2, 2]

    fake_server.desired = DesiredConfig("cfg-plain", 4)
    agent.cycle()
    assert fake_server.outcomes[-1].message == "time slice back to default"
    assert [gpu.time_slice for gpu in backend.sim.gpus] == [0, 0]
    assert fake_server.outcomes[-1].report.applied.config_id == "cfg-plain"


def test_xid_events_reach_the_server_once_even_across_a_failed_report(fake_server, make_agent, make_backend):
    backend = make_backend()
    agent = make_agent(backend)
    agent.cycle()
    backend.sim.inject_xid(1, 79)
    fake_server.failures["/api/v1/agent/report/"] = 1
    with pytest.raises(Exception, match="Service unavailable"):
        agent.cycle()
    agent.cycle()
    agent.cycle()
    sent = [event.xid for report in fake_server.reports for event in report.xid_events]
    assert sent == [79]


def test_an_outcome_that_could_not_be_sent_is_sent_before_the_next_report(fake_server, make_agent):
    fake_server.desired = DesiredConfig("cfg-a", 11, persistence_mode=True)
    fake_server.failures["/api/v1/agent/outcome/"] = 1
    agent = make_agent()
    with pytest.raises(Exception, match="Service unavailable"):
        agent.cycle()
    assert fake_server.outcomes == []
    agent.cycle()
    assert [o.status for o in fake_server.outcomes] == ["succeeded"]
    assert fake_server.reports[-1].applied.config_id == "cfg-a"


def test_applied_state_survives_a_restart_but_not_a_reboot(fake_server, make_agent, make_backend):
    backend = make_backend()
    fake_server.desired = DesiredConfig("cfg-a", 11, persistence_mode=True)
    make_agent(backend).cycle()
    make_agent(backend).cycle()  # the agent restarted, the node did not
    assert fake_server.reports[-1].applied.config_id == "cfg-a" and len(fake_server.outcomes) == 1
    backend.sim.reboot()
    make_agent(backend).cycle()
    assert fake_server.reports[-1].applied is None
    assert len(fake_server.outcomes) == 2  # the config is applied again


class RecordingStop(threading.Event):
    """Records each wait of the loop and ends it after a few."""

    def __init__(self, waits):
        super().__init__()
        self.delays = []
        self.waits = waits

    def wait(self, timeout=None):
        self.delays.append(timeout)
        if len(self.delays) >= self.waits:
            self.set()
        return self.is_set()


def test_network_errors_back_off_exponentially_up_to_a_cap(make_backend, state_dir, caplog):
    stop = RecordingStop(waits=5)
    settings = AgentSettings("http://127.0.0.1:9", state_dir, JOIN_TOKEN, interval=100, insecure_lab=True)
    assert Agent(settings, make_backend(), stop=stop).run() == EXIT_OK
    assert stop.delays == [100, 200, 300, 300, 300]
    assert caplog.text.count("server unreachable") == 5
    assert "Connection refused" in caplog.text

    once = AgentSettings("http://127.0.0.1:9", state_dir, JOIN_TOKEN, once=True, insecure_lab=True)
    assert Agent(once, make_backend()).run() == EXIT_FAILED


def test_secrets_never_reach_the_log(fake_server, make_agent, caplog):
    caplog.set_level(logging.DEBUG)
    fake_server.desired = DesiredConfig("cfg-a", 11, mig=mig_settings(BALANCED))
    agent = make_agent()
    agent.cycle()
    fake_server.revoke_all()
    agent.run()
    assert "registered as node sim-node-0 (id 1)" in caplog.text
    assert JOIN_TOKEN not in caplog.text and "cred-1-b7d01e" not in caplog.text
    assert "cred-1-b7d01e" not in repr(agent.credential) and "cred-1-b7d01e" not in repr(Credential("s", 1, "x"))


def test_a_dead_mps_daemon_is_started_again(fake_server, make_agent, make_backend):
    backend = make_backend()
    fake_server.desired = DesiredConfig("cfg-mps", 1, mps=MpsSettings(replicas=2))
    agent = make_agent(backend)
    agent.cycle()
    assert backend.sim.mps.running
    backend.sim.tools.run(["nvidia-cuda-mps-control"], input="quit\n")  # the agent's container was restarted
    make_agent(backend).cycle()
    assert fake_server.reports[-1].applied is None
    assert backend.sim.mps.running and [o.status for o in fake_server.outcomes] == ["succeeded", "succeeded"]


# --- QoS node settings -----------------------------------------------------------------------------------------------

POLICY = NodeSettings(
    GpuSettings(persistence_mode=True, compute_mode="prohibited", gpu_clock_min_mhz=1200, power_limit_w=500),
    HostTuning(transparent_hugepages="never", swappiness=10),
)


def test_a_config_with_node_settings_applies_them_and_the_outcome_lists_them(fake_server, make_agent, make_backend):
    backend = make_backend()
    agent = make_agent(backend)
    fake_server.desired = DesiredConfig("cfg-qos", 21, mig=mig_settings(BALANCED), node_settings=POLICY)
    agent.cycle()
    outcome = fake_server.outcomes[-1]
    assert (outcome.change_id, outcome.status) == (21, "succeeded")
    assert outcome.message == (
        "MIG config layout on GPU 0, 1; persistence mode on on GPU 0, 1; compute mode prohibited on GPU 0, 1; "
        "GPU clocks locked to 1200-1980 MHz; power limit 500 W on GPU 0, 1; THP never (was madvise); "
        "swappiness 10 (was 60)"
    )
    report = outcome.report
    assert report.applied.node_settings == POLICY and report.applied.mig_selected == "layout"
    assert {(g.compute_mode, g.persistence_mode, g.power_limit_w) for g in report.gpus} == {("prohibited", True, 500.0)}
    assert all(g.graphics_clock_mhz >= 1200 for g in report.gpus)
    assert (report.host.thp, report.host.swappiness) == ("never", 10)

    # The policy changes alone: a new config; what the agent set and the policy dropped is undone.
    lighter = NodeSettings(GpuSettings(persistence_mode=True), HostTuning(swappiness=10))
    fake_server.desired = DesiredConfig("cfg-qos-2", 22, mig=mig_settings(BALANCED), node_settings=lighter)
    agent.cycle()
    outcome = fake_server.outcomes[-1]
    assert (outcome.status, outcome.message) == (
        "succeeded",
        "compute mode default on GPU 0, 1; GPU clocks unlocked; power limit back to default on GPU 0, 1",
    )
    assert [gpu.locked_clocks for gpu in backend.sim.gpus] == [None, None]
    assert outcome.report.applied.node_settings == lighter
    assert outcome.report.host.thp == "never"  # host tuning the policy drops stays as it is


def test_what_the_agent_set_is_remembered_across_a_restart(fake_server, make_agent, make_backend):
    backend = make_backend()
    fake_server.desired = DesiredConfig("cfg-a", 1, node_settings=NodeSettings(GpuSettings(gpu_clock_max_mhz=1500)))
    make_agent(backend).cycle()
    assert backend.sim.gpus[0].locked_clocks == (210, 1500)
    fake_server.desired = DesiredConfig("cfg-b", 2)  # no QoS policy any more
    make_agent(backend).cycle()  # a restarted agent still knows it locked the clocks
    assert fake_server.outcomes[-1].message == "GPU clocks unlocked"
    assert backend.sim.gpus[0].locked_clocks is None


def test_the_policys_mps_limits_go_to_the_mps_daemon(fake_server, make_agent, make_backend):
    backend = make_backend()
    agent = make_agent(backend)
    policy = NodeSettings(GpuSettings(mps_active_thread_percentage=30, mps_pinned_memory_limit_mib=8192))
    fake_server.desired = DesiredConfig("cfg-mps", 1, mps=MpsSettings(replicas=4), node_settings=policy)
    agent.cycle()
    assert fake_server.outcomes[-1].message == (
        "MPS for 4 clients per GPU (active threads 30 %, pinned memory 8192 MiB per GPU)"
    )
    mps = backend.sim.mps
    assert (mps.running, mps.active_thread_percentage, mps.pinned_mem_limits) == (True, 30, {0: "8192M", 1: "8192M"})
    assert fake_server.outcomes[-1].report.applied.mps == MpsSettings(4, 30, 8192)
    assert {gpu.compute_mode for gpu in fake_server.outcomes[-1].report.gpus} == {"exclusive_process"}

    fake_server.desired = DesiredConfig("cfg-mps-2", 2, mps=MpsSettings(replicas=4))  # the policy is detached
    agent.cycle()
    assert fake_server.outcomes[-1].message == "MPS stopped; MPS for 4 clients per GPU"
    assert backend.sim.mps.active_thread_percentage == 25


@pytest.mark.parametrize(
    ("desired", "message"),
    [
        (
            DesiredConfig("c", 1, mps=MpsSettings(2), node_settings=NodeSettings(GpuSettings(compute_mode="default"))),
            "MPS needs compute mode exclusive_process (contracts §3.3); the QoS policy asks for default",
        ),
        (
            DesiredConfig(
                "c",
                1,
                time_slice=TimeSliceSettings("short"),
                node_settings=NodeSettings(GpuSettings(compute_mode="prohibited")),
            ),
            "time-slicing shares each GPU between processes; compute mode prohibited does not allow that",
        ),
        (
            DesiredConfig(
                "c",
                1,
                time_slice=TimeSliceSettings("short"),
                node_settings=NodeSettings(GpuSettings(time_slice_interval="long")),
            ),
            "the sharing config sets time slice short and the QoS policy long",
        ),
        (
            DesiredConfig(
                "c", 1, persistence_mode=True, node_settings=NodeSettings(GpuSettings(persistence_mode=False))
            ),
            "the sharing config turns persistence mode on and the QoS policy off",
        ),
        (
            DesiredConfig("c", 1, node_settings=NodeSettings(GpuSettings(mps_active_thread_percentage=50))),
            "the QoS policy sets MPS limits, but this config runs no MPS",
        ),
        (
            DesiredConfig(
                "c", 1, mig=mig_settings(BALANCED), node_settings=NodeSettings(GpuSettings(power_limit_w=5000))
            ),
            "GPU 0, 1: power limit 5000 W is outside this GPU's 200-700 W",
        ),
    ],
)
def test_contradicting_or_impossible_settings_fail_before_anything_changes(
    fake_server, make_agent, make_backend, desired, message
):
    backend = make_backend()
    fake_server.desired = desired
    make_agent(backend).cycle()
    outcome = fake_server.outcomes[-1]
    assert outcome.status == "failed" and outcome.message.startswith(message)
    assert [gpu.mig_current for gpu in backend.sim.gpus] == [False, False] and not backend.sim.mps.running


def test_host_tuning_refused_for_lack_of_root_is_a_failed_outcome_not_a_crash(fake_server, make_agent, make_backend):
    backend = make_backend()
    backend.sim.host.writable = False
    agent = make_agent(backend, once=True)
    fake_server.desired = DesiredConfig("cfg-host", 5, node_settings=NodeSettings(host=HostTuning(swappiness=1)))
    assert agent.run() == EXIT_OK
    outcome = fake_server.outcomes[-1]
    assert outcome.status == "failed"
    assert outcome.message == (
        "host tuning: cannot write /proc/sys/vm/swappiness: permission denied (the agent must run as root, privileged "
        "in a container); nothing was changed"
    )
    assert outcome.report.applied is None and outcome.report.host.swappiness == 60


def test_a_policy_time_slice_replaces_the_sharing_one_without_a_detour(fake_server, make_agent, make_backend):
    backend = make_backend()
    agent = make_agent(backend)
    fake_server.desired = DesiredConfig("cfg-ts", 1, time_slice=TimeSliceSettings("short"))
    agent.cycle()
    backend.sim.tools.calls.clear()
    policy = NodeSettings(GpuSettings(time_slice_interval="long"))
    fake_server.desired = DesiredConfig("cfg-policy", 2, node_settings=policy)
    agent.cycle()
    assert fake_server.outcomes[-1].message == "time slice long"
    assert {call[-1] for call in backend.sim.tools.calls} == {"3"}  # never back to 0 on the way
    fake_server.desired = DesiredConfig("cfg-none", 3)
    agent.cycle()
    assert fake_server.outcomes[-1].message == "time slice back to default"
    assert [gpu.time_slice for gpu in backend.sim.gpus] == [0, 0]


def test_reports_carry_the_digest_of_their_inventory(fake_server, make_agent, make_backend):
    backend = make_backend()
    agent = make_agent(backend)
    agent.cycle()
    backend.sim.start_process(0, used_mib=512)
    agent.cycle()
    first, second = fake_server.reports[-2:]
    assert first.inventory_digest == inventory_digest(first) == second.inventory_digest == inventory_digest(second)


def test_the_outcome_message_is_cleaned_so_the_server_takes_it(fake_server, make_agent, monkeypatch):
    """The server refuses control characters and over-long text (issue 25); an outcome is re-sent until taken, so
    the agent cleans what a tool printed (colour escapes) before it sends it."""
    fake_server.desired = DesiredConfig("cfg-a", 11, mig=mig_settings(BALANCED))
    agent = make_agent()
    monkeypatch.setattr(agent, "_apply", lambda desired, key: ("failed", "\x1b[31mboom\x1b[0m" + "x" * 30_000))
    agent.cycle()
    (outcome,) = fake_server.outcomes
    assert outcome.message.startswith("\ufffd[31mboom\ufffd[0mxxx") and len(outcome.message) == 20_000
