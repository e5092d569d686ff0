"""Server-side printing details kubectl shows as they are."""

from simulator.tables import human_duration


def test_human_duration_matches_kubectl():
    assert [human_duration(s) for s in (5, 119, 150, 600, 3 * 3600, 5 * 3600 + 60, 30 * 3600, 3 * 86400)] == [
        "5s", "119s", "2m30s", "10m", "3h", "5h1m", "30h", "3d",
    ]  # fmt: skip
    assert human_duration(400 * 86400) == "400d" and human_duration(800 * 86400) == "2y70d"
