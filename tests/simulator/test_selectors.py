"""Label and field selector grammar."""

import pytest

from simulator.errors import ApiError
from simulator.selectors import build_matcher, parse_label_selector

POD = {"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x", "tier": "gpu"}}, "spec": {"nodeName": "n1"}}
FIELDS = frozenset({"metadata.name", "metadata.namespace", "spec.nodeName"})


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=x", True),
        ("app==x,tier=gpu", True),
        ("app!=x", False),
        ("app in (x, y)", True),
        ("tier notin (gpu)", False),
        ("missing notin (a)", True),
        ("missing!=a", True),
        ("app", True),
        ("!app", False),
        ("!missing,app in (x),tier", True),
    ],
)
def test_label_selector(selector, expected):
    assert build_matcher(selector, None, FIELDS, "pods")(POD) is expected


def test_field_selector_and_refusals():
    assert build_matcher(None, "spec.nodeName=n1,metadata.namespace!=other", FIELDS, "pods")(POD)
    assert not build_matcher(None, "spec.nodeName==n2", FIELDS, "pods")(POD)
    assert build_matcher(None, None, FIELDS, "pods") is None
    with pytest.raises(ApiError) as error:
        build_matcher(None, "status.podIP=1", FIELDS, "pods")
    assert error.value.code == 400
    with pytest.raises(ApiError):
        parse_label_selector("bad key!=x y")
