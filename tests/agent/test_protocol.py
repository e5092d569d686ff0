"""The wire contract: every message survives to_dict → JSON → from_dict unchanged, and bad input names its field."""

import dataclasses
import json
import types
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import protocol
from agent.protocol import (
    AppliedState,
    DesiredConfig,
    ErrorBody,
    GpuReport,
    GpuSettings,
    HostTuning,
    NodeSettings,
    ProtocolError,
    RegisterRequest,
    RegisterResponse,
    Report,
    ReportMetrics,
    XidEvent,
    inventory_digest,
)
from tests.agent.protocol_values import json_values

MESSAGES = [
    cls
    for cls in vars(protocol).values()
    if isinstance(cls, type) and issubclass(cls, protocol.Message) and cls is not protocol.Message
]


@pytest.mark.parametrize("message_type", MESSAGES, ids=lambda cls: cls.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_message_round_trips_through_json(message_type, data):
    message = message_type.from_dict(data.draw(json_values(message_type)))
    assert message_type.from_dict(json.loads(json.dumps(message.to_dict()))) == message
    assert message_type.from_dict(message.to_dict()) == message


def test_the_contract_covers_the_endpoints_and_messages_of_the_brief():
    assert protocol.REGISTER_PATH == "/api/v1/agent/register/"
    assert protocol.REPORT_PATH == "/api/v1/agent/report/"
    assert protocol.DESIRED_PATH == "/api/v1/agent/desired/"
    assert protocol.OUTCOME_PATH == "/api/v1/agent/outcome/"
    assert [f.name for f in dataclasses.fields(Report)] == [
        "agent_version", "hostname", "driver_version", "cuda_version", "numa_nodes", "gpus", "xid_events", "host",
        "applied", "inventory_digest",
    ]  # fmt: skip
    assert [f.name for f in dataclasses.fields(DesiredConfig)] == [
        "config_id", "change_id", "mig", "mps", "time_slice", "persistence_mode", "safety", "node_settings",
    ]  # fmt: skip


def test_secrets_stay_out_of_reprs():
    assert "tok-secret" not in repr(RegisterRequest("tok-secret", "node-1", "0.1.0"))
    assert "cred-secret" not in repr(RegisterResponse(4, "node-1", "cred-secret", 30))


def test_missing_and_mistyped_fields_are_named():
    with pytest.raises(ProtocolError, match=r"RegisterResponse.credential is required"):
        RegisterResponse.from_dict({"node_id": 1, "node_name": "n", "interval_seconds": 30})
    with pytest.raises(ProtocolError, match=r"RegisterResponse.node_id must be int, not '1'"):
        RegisterResponse.from_dict({"node_id": "1", "node_name": "n", "credential": "c", "interval_seconds": 30})
    with pytest.raises(ProtocolError, match=r"DesiredConfig.time_slice.interval must be one of default, short"):
        DesiredConfig.from_dict({"config_id": "c", "change_id": None, "time_slice": {"interval": "forever"}})
    with pytest.raises(ProtocolError, match=r"must be int, not True"):
        RegisterResponse.from_dict({"node_id": True, "node_name": "n", "credential": "c", "interval_seconds": 30})


def test_unknown_keys_are_ignored_and_defaults_fill_in():
    desired = DesiredConfig.from_dict({"config_id": "cfg-1", "change_id": 9, "added_later": {"x": 1}})
    assert desired.safety.busy_policy == "wait" and desired.safety.wait_seconds == 0
    assert desired.mig is None and desired.mps is None and desired.persistence_mode is None
    assert ErrorBody.from_dict({"message": "nope"}).errors == {}


# --- QoS node settings ---------------------------------------------------------------------------------------------

SERVER_NODE_SETTINGS = {  # the shape of QoSPolicy.node_settings(): only the fields the policy sets
    "gpu": {"persistence_mode": True, "compute_mode": "exclusive_process", "power_limit_w": 450},
    "host": {"transparent_hugepages": "never", "swappiness": 10},
}


def test_node_settings_travel_exactly_as_the_server_writes_them():
    desired = DesiredConfig.from_dict({"config_id": "c", "change_id": 3, "node_settings": SERVER_NODE_SETTINGS})
    assert desired.node_settings == NodeSettings(
        GpuSettings(persistence_mode=True, compute_mode="exclusive_process", power_limit_w=450),
        HostTuning(transparent_hugepages="never", swappiness=10),
    )
    assert desired.node_settings.gpu.gpu_clock_min_mhz is None  # not set: left alone
    assert desired.to_dict()["node_settings"] == SERVER_NODE_SETTINGS  # nulls are left out, as the server does
    assert DesiredConfig.from_dict(json.loads(json.dumps(desired.to_dict()))) == desired
    applied = AppliedState("c", node_settings=desired.node_settings)
    assert AppliedState.from_dict(applied.to_dict()) == applied
    assert NodeSettings.from_dict({"gpu": {}, "host": {}}).to_dict() == {"gpu": {}, "host": {}}


def test_without_node_settings_everything_reads_as_before():
    assert DesiredConfig.from_dict({"config_id": "c", "change_id": None}).node_settings is None
    assert DesiredConfig.from_dict({"config_id": "c", "change_id": None, "node_settings": None}).node_settings is None
    assert AppliedState.from_dict({"config_id": "c"}).node_settings is None
    assert DesiredConfig("c", None).to_dict()["node_settings"] is None


def test_a_report_from_an_older_agent_has_no_clock_or_power_limit_fields():
    gpu = {f.name: None for f in dataclasses.fields(GpuReport) if f.default is dataclasses.MISSING}
    gpu.update(uuid="GPU-1", index=0, name="n", product="p", pci_bus_id="b", pci_device_id="d", memory_total_mib=1)
    gpu.update(mig_capable=False, gpu_instances=[], mig_devices=[], processes=[])
    parsed = GpuReport.from_dict(gpu)
    assert (parsed.power_limit_w, parsed.graphics_clock_mhz, parsed.max_graphics_clock_mhz) == (None, None, None)


def test_bad_node_settings_are_named():
    with pytest.raises(ProtocolError, match=r"DesiredConfig.node_settings.gpu.compute_mode must be one of default"):
        DesiredConfig.from_dict({"config_id": "c", "change_id": 1, "node_settings": {"gpu": {"compute_mode": "x"}}})
    with pytest.raises(ProtocolError, match=r"node_settings.host.swappiness must be int, not '10'"):
        DesiredConfig.from_dict({"config_id": "c", "change_id": 1, "node_settings": {"host": {"swappiness": "10"}}})


def test_what_the_servers_qos_policy_produces_parses():
    from sharing.models import QoSPolicy

    policy = QoSPolicy(
        name="p",
        persistence_mode=True,
        compute_mode="prohibited",
        time_slice_interval="long",
        mps_active_thread_percentage=50,
        mps_pinned_memory_limit_mib=4096,
        gpu_clock_min_mhz=1200,
        gpu_clock_max_mhz=1800,
        power_limit_w=400,
        transparent_hugepages="madvise",
        swappiness=1,
        cpu_governor="performance",
        dirty_ratio=15,
        dirty_background_ratio=5,
    )
    full = NodeSettings.from_dict(policy.node_settings())
    assert full.to_dict() == policy.node_settings()
    assert all(value is not None for value in dataclasses.asdict(full.gpu).values())
    assert all(value is not None for value in dataclasses.asdict(full.host).values())
    assert NodeSettings.from_dict(QoSPolicy(name="empty").node_settings()) == NodeSettings()


def _report_of(backend, **changes) -> Report:
    snapshot = backend.snapshot()
    report = Report("0.1.0", snapshot.hostname, snapshot.driver_version, snapshot.cuda_version, snapshot.numa_nodes,
                    snapshot.gpus, (), snapshot.host, None)  # fmt: skip
    return dataclasses.replace(report, **changes)


def test_the_inventory_digest_leaves_out_what_moves_and_keeps_what_is_configured():
    from agent.backends.simulated import SimulatedBackend

    backend = SimulatedBackend(seed=3, gpus=2, workload=False)
    try:
        first = _report_of(backend)
        backend.sim.start_process(0, used_mib=1024)  # a job outside MIG: a metric
        moved = _report_of(backend, agent_version="0.2.0", xid_events=(XidEvent(first.gpus[0].uuid, 13, "now"),))
        assert moved.gpus[0].processes and not first.gpus[0].processes
        assert inventory_digest(moved) == inventory_digest(first)
        assert inventory_digest(dataclasses.replace(moved, inventory_digest="anything")) == inventory_digest(first)
        thp = dataclasses.replace(first, host=dataclasses.replace(first.host, thp="always"))
        powered = dataclasses.replace(first, gpus=(dataclasses.replace(first.gpus[0], power_limit_w=500.0),
                                                   first.gpus[1]))  # fmt: skip
        applied = dataclasses.replace(first, applied=AppliedState("cfg-1"))
        digests = {inventory_digest(r) for r in (first, thp, powered, applied)}
        assert len(digests) == 4
    finally:
        backend.close()


def test_any_report_reads_as_its_metrics():
    from agent.backends.simulated import SimulatedBackend

    backend = SimulatedBackend(seed=3, gpus=2, workload=False)
    try:
        report = _report_of(backend)
        report = dataclasses.replace(report, inventory_digest=inventory_digest(report))
        metrics = ReportMetrics.from_dict(json.loads(json.dumps(report.to_dict())))
        assert metrics.inventory_digest == report.inventory_digest and metrics.hostname == report.hostname
        assert [(m.uuid, m.temperature_c, m.power_w) for m in metrics.gpus] == [
            (g.uuid, g.temperature_c, g.power_w) for g in report.gpus
        ]
    finally:
        backend.close()


def _unbounded(hint, where: str) -> list[str]:
    """The numbers and strings under a type hint that carry no bounds (issue 25: one node's 2**63 blinded the
    fleet; a 100,000-character host.thp was stored, a U+202E shown on the node page)."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return []
    if origin in (typing.Union, types.UnionType, tuple):
        return [found for arg in typing.get_args(hint) for found in _unbounded(arg, where)]
    return [where] if hint in (int, float, str) else []


def test_every_number_and_string_of_the_protocol_is_bounded():
    unbounded = [
        found
        for cls in MESSAGES
        for name, hint in typing.get_type_hints(cls, include_extras=True).items()
        for found in _unbounded(hint, f"{cls.__name__}.{name}")
    ]
    assert unbounded == []
    with pytest.raises(ProtocolError, match=r"^GpuMetrics.temperature_c must be from -40 to 200, not 92233720"):
        protocol.GpuMetrics.from_dict(
            {"uuid": "GPU-1", "memory_used_mib": 0, "processes": [], "utilization_pct": None, "temperature_c": 2**63,
             "power_w": None, "ecc_sbe_total": None, "ecc_dbe_total": None}
        )  # fmt: skip
    with pytest.raises(ProtocolError, match=r"^HostSettings.thp must be at most 32 characters, not 100000$"):
        protocol.HostSettings.from_dict(
            {"thp": "x" * 100_000, "swappiness": None, "cpu_governor": None, "dirty_ratio": None,
             "dirty_background_ratio": None}
        )  # fmt: skip
    with pytest.raises(ProtocolError, match=r"^RegisterRequest.join_token cannot contain control characters \(U\+"):
        RegisterRequest.from_dict({"join_token": "secret\u202e", "hostname": "n", "agent_version": "1"})


def test_agent_strings_follow_the_rule_of_names_people_give():
    from core.fields import REFUSED_CATEGORIES

    assert protocol.REFUSED_CATEGORIES == REFUSED_CATEGORIES


def test_free_text_the_agent_makes_up_is_cleaned_to_pass():
    text = "mig-parted: \x1b[31mfailed\x1b[0m\n\tGPU 0\u202e" + "x" * 30_000
    cleaned = protocol.WORDS.cleaned(text)
    assert protocol.WORDS.problem(cleaned) is None and cleaned.startswith("mig-parted: \ufffd[31mfailed\ufffd[0m\n\t")
    assert len(cleaned) == protocol.WORDS.max_length
