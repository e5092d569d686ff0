"""Patch semantics the real API server applies (merge, strategic merge, JSON patch)."""

import pytest

from simulator.errors import ApiError
from simulator.patches import apply_patch, json_patch, merge_patch, strategic_merge_patch

NODE = {
    "metadata": {"name": "n", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
    "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "DiskPressure", "status": "False"}]},
}


def test_merge_patch_null_deletes_and_lists_replace():
    patched = merge_patch(NODE, {"metadata": {"labels": {"a": None, "c": "3"}}, "spec": {"taints": []}})
    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}
    assert patched["spec"]["taints"] == []
    assert NODE["metadata"]["labels"] == {"a": "1", "b": "2"}  # the stored snapshot is untouched


def test_strategic_merge_merges_keyed_lists_and_honours_directives():
    patched = strategic_merge_patch(
        NODE,
        {
            "metadata": {"finalizers": ["y"]},
            "status": {
                "conditions": [{"type": "Ready", "status": "False"}, {"type": "DiskPressure", "$patch": "delete"}]
            },
            "spec": {"$patch": "replace", "unschedulable": True},
        },
    )
    assert patched["metadata"]["finalizers"] == ["x", "y"]
    assert patched["status"]["conditions"] == [{"type": "Ready", "status": "False"}]
    assert patched["spec"] == {"unschedulable": True}
    removed = strategic_merge_patch(NODE, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}})
    assert removed["metadata"]["finalizers"] == []


def test_json_patch_operations_and_escapes():
    ops = [
        {"op": "add", "path": "/metadata/labels/nvidia.com~1mig.config", "value": "all-balanced"},
        {"op": "replace", "path": "/metadata/labels/a", "value": "9"},
        {"op": "remove", "path": "/metadata/labels/b"},
        {"op": "copy", "from": "/metadata/labels/a", "path": "/metadata/labels/tilde~0key"},
        {"op": "move", "from": "/spec/taints/0", "path": "/spec/moved"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "z"},
        {"op": "test", "path": "/metadata/labels/a", "value": "9"},
    ]
    patched = json_patch(NODE, ops)
    assert patched["metadata"]["labels"] == {"a": "9", "nvidia.com/mig.config": "all-balanced", "tilde~key": "9"}
    assert patched["spec"] == {"taints": [], "moved": {"key": "k", "effect": "NoSchedule"}}
    assert patched["metadata"]["finalizers"] == ["x", "z"]


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/metadata/labels/a", "value": "2"}],
        [{"op": "remove", "path": "/metadata/labels/missing"}],
        [{"op": "replace", "path": "/nope/deeper", "value": 1}],
        [{"op": "frobnicate", "path": "/metadata"}],
    ],
)
def test_failed_json_patches_are_422(ops):
    with pytest.raises(ApiError) as error:
        json_patch(NODE, ops)
    assert error.value.code == 422


def test_unknown_patch_type_is_415():
    with pytest.raises(ApiError) as error:
        apply_patch(NODE, "application/apply-patch+yaml", {})
    assert error.value.code == 415
