"""Many simulated agents in one process, each its own node, against one server."""

import time

from agent.fleet import start_fleet
from tests.agent.conftest import JOIN_TOKEN


def wait_for(condition, fake_server, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with fake_server.lock:
            if condition(list(fake_server.reports)):
                return True
        time.sleep(0.02)
    return False


def test_a_fleet_of_simulated_agents_registers_and_reports(fake_server, tmp_path):
    products = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A30")
    fleet = start_fleet(
        fake_server.url, JOIN_TOKEN, 3, tmp_path, first_seed=10, products=products, interval=0.05, insecure_lab=True
    )
    try:
        assert wait_for(lambda reports: len({r.hostname for r in reports}) == 3, fake_server)
        fleet.agents[0].backend.sim.inject_xid(1, 79)  # each node stays reachable for fault injection
        assert wait_for(lambda reports: any(r.hostname == "sim-node-10" and r.xid_events for r in reports), fake_server)
    finally:
        fleet.stop()
    assert fleet.exit_codes == {"sim-node-10": 0, "sim-node-11": 0, "sim-node-12": 0}
    assert sorted(r.hostname for r in fake_server.registrations) == ["sim-node-10", "sim-node-11", "sim-node-12"]
    models = {r.hostname: (r.gpus[0].product, len(r.gpus)) for r in fake_server.reports}
    assert models == {
        "sim-node-10": ("NVIDIA-H100-80GB-HBM3", 8),
        "sim-node-11": ("NVIDIA-A30", 8),
        "sim-node-12": ("NVIDIA-H100-80GB-HBM3", 8),
    }
    xids = [e.xid for r in fake_server.reports if r.hostname == "sim-node-10" for e in r.xid_events]
    assert xids == [79]
    assert all((tmp_path / host / "credential.json").exists() for host in models)
