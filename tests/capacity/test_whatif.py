"""The what-if replay on a recorded week whose best layout is known (capacity.whatif)."""

from datetime import UTC, datetime, time, timedelta

from capacity.whatif import Demand, candidates, in_window, node_counts, recommend

A100 = "NVIDIA-A100-SXM4-40GB"
GPU, SLICE = "nvidia.com/gpu", "nvidia.com/mig-3g.20gb"
DAY = {"weekdays": range(5), "start": time(8), "end": time(20), "tz": "UTC"}


def recorded_week():
    """4 nodes of 2 A100s, all whole GPUs. By day (Mon–Fri 08–20) 4 GPUs are busy and 1 more pod asks for a whole
    GPU each hour (it starts at once), while 8 3g.20gb slices are asked for and none exists: 2 new such pods each
    hour wait with 6 units ahead of them. By night and at weekends all 8 GPUs are busy, nothing waits."""
    start = datetime(2025, 3, 3, tzinfo=UTC)  # a Monday
    samples = []
    for hour in range(7 * 24):
        at = start + timedelta(hours=hour)
        if in_window(at, **DAY):
            demand = {
                GPU: Demand(capacity=8, used=4, pending_units=0, arrived=1, arrived_units=1, started_within_5min=1),
                SLICE: Demand(capacity=0, used=0, pending_units=8, arrived=2, arrived_units=2, started_within_5min=0),
            }
        else:
            demand = {
                GPU: Demand(capacity=8, used=8, pending_units=0, arrived=0, arrived_units=0, started_within_5min=0)
            }
        samples.append((at, (3600.0, demand)))
    return samples


def test_the_recorded_weeks_known_best_by_day_is_two_nodes_of_two_3g_slices():
    day = [sample for at, sample in recorded_week() if in_window(at, **DAY)]
    assert len(day) == 5 * 12
    options = candidates([A100], gpus_per_node=2, pool_nodes=4)
    result = recommend(day, pool_nodes=4, candidates=options)

    assert result.best.candidate.nodes == 2
    assert result.best.candidate.layout == {"3g.20gb": 2}
    assert (result.best.waiting, result.best.started_within_5min, result.best.idle_pct) == (180, 180, 0.0)
    # Today: only the whole-GPU pods started at once (60 of 180); half of the GPUs idled.
    assert (result.today.waiting, result.today.started_within_5min, result.today.idle_pct) == (180, 60, 50.0)
    assert result.sentence == (
        "2 nodes at 3g.20gb ×2: 180 of 180 waiting pods would have started within 5 min (today 60); "
        "idle GPU-hours 50 % → 0 %"
    )


def test_three_nodes_of_slices_starve_the_whole_gpu_pods_and_one_node_is_too_few():
    day = [sample for at, sample in recorded_week() if in_window(at, **DAY)]
    by_nodes = {
        o.candidate.nodes: o
        for o in recommend(day, pool_nodes=4, candidates=candidates([A100], gpus_per_node=2, pool_nodes=4)).outcomes
        if o.candidate.layout == {"3g.20gb": 2}
    }
    assert by_nodes[3].started_within_5min == 120  # 2 GPUs left for 3 whole-GPU pods ahead: the arrival waits
    assert by_nodes[1].started_within_5min == 60  # 4 slices, 6 units ahead: no slice pod starts


def test_by_night_the_pool_as_it_is_is_best_kept_whole():
    night = [sample for at, sample in recorded_week() if not in_window(at, **DAY)]
    result = recommend(night, pool_nodes=4, candidates=candidates([A100], gpus_per_node=2, pool_nodes=4))
    assert result.best.candidate.layout is None  # whole GPUs: nothing idles, nothing waits
    assert result.best.idle_pct == 0.0


def test_candidates_come_from_the_catalog_for_the_pools_products():
    options = candidates([A100], gpus_per_node=2, pool_nodes=4)
    layouts = {o.layout_text for o in options}
    assert "whole GPUs" in layouts and "3g.20gb ×2" in layouts and "1g.5gb ×7" in layouts
    assert {o.nodes for o in options} == {1, 2, 3, 4}
    seven = next(o for o in options if o.layout == {"1g.5gb": 7} and o.nodes == 1)
    assert seven.per_node == {"nvidia.com/mig-1g.5gb": 14}
    assert seven.shares == {"nvidia.com/mig-1g.5gb": 1 / 7}
    # A GPU outside the catalog (T4: no MIG) offers whole GPUs only.
    assert {o.layout_text for o in candidates(["Tesla-T4"], gpus_per_node=1, pool_nodes=2)} == {"whole GPUs"}


def test_node_counts_stay_few_on_large_pools():
    assert node_counts(3) == [1, 2, 3]
    assert node_counts(1000) == [1, 2, 3, 4, 5, 6, 7, 8, 125, 250, 375, 500, 625, 750, 875, 1000]


def test_windows_past_midnight_belong_to_their_starting_day():
    night = {"weekdays": [4], "start": time(22), "end": time(6), "tz": "Europe/Berlin"}
    assert in_window(datetime(2025, 3, 7, 21, 30, tzinfo=UTC), **night)  # Fri 22:30 CET
    assert in_window(datetime(2025, 3, 8, 4, 0, tzinfo=UTC), **night)  # Sat 05:00 CET
    assert not in_window(datetime(2025, 3, 9, 4, 0, tzinfo=UTC), **night)  # Sun 05:00: Saturday is not in it
