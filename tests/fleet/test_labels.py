import pytest

from fleet.labels import parse_selector, selector_matches


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a!=b", {"a": "b"}, False),
        ("tier in (gold, silver), !legacy", {"tier": "gold"}, True),
        ("tier in (gold, silver), !legacy", {"tier": "gold", "legacy": "1"}, False),
        ("tier notin (bronze)", {"tier": "gold"}, True),
        ("nvidia.com/gpu.present", {"nvidia.com/gpu.present": "true"}, True),
        ("", {"a": "b"}, False),
    ],
)
def test_selector_matching(selector, labels, expected):
    assert selector_matches(parse_selector(selector), labels) is expected


@pytest.mark.parametrize("bad", ["a in b", "=b", "a = b c", "a in (x"])
def test_bad_selectors_are_refused(bad):
    with pytest.raises(ValueError, match="not a valid label selector term"):
        parse_selector(bad)
