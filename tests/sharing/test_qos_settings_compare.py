"""The pure comparison of a QoS policy's node settings with what a node reported: per setting matches / differs /
not reported, GPU settings counted over the node's GPUs, unreadable settings against the agent's record."""

from sharing.qos import DIFFERS, MATCHES, NOT_REPORTED, SettingCheck, compare_node_settings

HOST = {
    "thp": "madvise",
    "swappiness": 60,
    "cpu_governor": "performance",
    "dirty_ratio": 20,
    "dirty_background_ratio": 10,
}


def gpu(**values):
    return {
        "compute_mode": "default",
        "persistence_mode": True,
        "power_limit_w": 700.0,
        "applications_clock_mhz": 1755,
        "max_graphics_clock_mhz": 1980,
        **values,
    }


def checks(desired, *, host=HOST, gpus=(), agent_record=None) -> dict[str, SettingCheck]:
    found = compare_node_settings(desired, host=host, gpus=list(gpus), agent_record=agent_record)
    return {c.name: c for c in found.checks}


def test_host_tuning_maps_policy_keys_to_the_agents_readings():
    desired = {"gpu": {}, "host": {"transparent_hugepages": "madvise", "swappiness": 10, "dirty_ratio": 20}}
    found = checks(desired)
    assert found["transparent_hugepages"] == SettingCheck(
        "host", "transparent_hugepages", "madvise", MATCHES, (("madvise", 1),)
    )
    assert found["swappiness"].status == DIFFERS and found["swappiness"].observed == ((60, 1),)
    assert found["dirty_ratio"].status == MATCHES


def test_an_unreadable_host_setting_is_not_reported():
    found = checks({"gpu": {}, "host": {"cpu_governor": "performance"}}, host={**HOST, "cpu_governor": None})
    assert found["cpu_governor"].status == NOT_REPORTED and found["cpu_governor"].observed == ()


def test_gpu_settings_match_only_on_every_gpu():
    desired = {"gpu": {"persistence_mode": True, "power_limit_w": 700}, "host": {}}
    found = checks(desired, gpus=[gpu()] * 8)
    assert found["power_limit_w"].status == MATCHES  # 700 asked, 700.0 W read
    assert (found["power_limit_w"].gpus, found["power_limit_w"].gpus_differ) == (8, 0)
    assert found["persistence_mode"].observed == ((True, 8),)


def test_gpu_settings_count_the_gpus_that_differ_most_common_value_first():
    desired = {"gpu": {"compute_mode": "exclusive_process"}, "host": {}}
    gpus = [gpu(compute_mode="default")] * 6 + [gpu(compute_mode="exclusive_process")] * 2
    check = checks(desired, gpus=gpus)["compute_mode"]
    assert check.status == DIFFERS
    assert (check.gpus, check.gpus_differ, check.gpus_unreported) == (8, 6, 0)
    assert check.observed == (("default", 6), ("exclusive_process", 2))


def test_a_bool_reading_is_not_a_number():
    check = checks({"gpu": {"persistence_mode": True}, "host": {}}, gpus=[gpu(persistence_mode=1)])["persistence_mode"]
    assert check.status == DIFFERS


def test_gpus_that_cannot_read_a_setting_make_it_not_reported_unless_another_differs():
    desired = {"gpu": {"power_limit_w": 700}, "host": {}}
    some = checks(desired, gpus=[gpu(), gpu(power_limit_w=None)])["power_limit_w"]
    assert (some.status, some.gpus_unreported, some.observed) == (NOT_REPORTED, 1, ((700.0, 1),))
    differs = checks(desired, gpus=[gpu(power_limit_w=450.0), gpu(power_limit_w=None)])["power_limit_w"]
    assert (differs.status, differs.gpus_differ, differs.gpus_unreported) == (DIFFERS, 1, 1)
    # An older agent: no settings at all for its GPUs.
    assert checks(desired, gpus=[None, None])["power_limit_w"].status == NOT_REPORTED
    assert checks(desired, gpus=[])["power_limit_w"].status == NOT_REPORTED


def test_settings_nvml_cannot_read_back_compare_with_the_agents_record():
    desired = {
        "gpu": {"gpu_clock_min_mhz": 1200, "gpu_clock_max_mhz": 1800, "time_slice_interval": "short"},
        "host": {},
    }
    gpus = [gpu()] * 2
    unknown = checks(desired, gpus=gpus)
    assert {c.status for c in unknown.values()} == {NOT_REPORTED}
    assert all(c.agent_record for c in unknown.values())
    record = {"gpu": {"gpu_clock_min_mhz": 1200, "gpu_clock_max_mhz": 1500}, "host": {}}
    found = checks(desired, gpus=gpus, agent_record=record)
    assert found["gpu_clock_min_mhz"].status == MATCHES and found["gpu_clock_min_mhz"].observed == ((1200, 2),)
    assert found["gpu_clock_max_mhz"].status == DIFFERS
    # The agent applied a config without a time slice: it left the GPU's own.
    assert found["time_slice_interval"].status == DIFFERS and found["time_slice_interval"].observed == ()


def test_overall_status():
    desired = {"gpu": {"power_limit_w": 700}, "host": {"swappiness": 60, "dirty_ratio": 5}}
    never = compare_node_settings(desired, host=None, gpus=[None], agent_record=None)
    assert never.status == "awaiting" and not never.reported
    differs = compare_node_settings(desired, host=HOST, gpus=[gpu()], agent_record=None)
    assert (differs.status, differs.differing, differs.unreported) == (DIFFERS, 1, 0)
    applied = compare_node_settings(
        {"gpu": {"power_limit_w": 700}, "host": {"swappiness": 60}}, host=HOST, gpus=[gpu()], agent_record=None
    )
    assert applied.status == MATCHES and applied.reported
    unseen = compare_node_settings(
        {"gpu": {"power_limit_w": 700}, "host": {}}, host=HOST, gpus=[gpu(power_limit_w=None)], agent_record=None
    )
    assert (unseen.status, unseen.unreported) == (NOT_REPORTED, 1)
