"""sharing.dra: newest complete pool generations and the GPU stack a node runs, from what the cluster shows."""

from sharing.dra import (
    DEVICE_PLUGIN,
    DRA_CLUSTER_POLICY,
    DRA_GPU_CLUSTER,
    newest_complete,
    node_stack,
    parse_feature_gates,
)


def _slice(name, pool, generation, count=1, **spec):
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": pool,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            **spec,
        },
    }


def _pod(labels, gates=""):
    env = [{"name": "FEATURE_GATES", "value": gates}] if gates else []
    return {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "gpus", "env": env}]}}


def test_only_the_newest_generation_counts_and_only_once_complete():
    pools = newest_complete(
        [
            _slice("old", "a", 1),
            _slice("new-0", "a", 2, count=2),
            _slice("b-0", "b", 3),
            _slice("b-old", "b", 2),
        ]
    )
    assert "a" not in {pool for _, pool in pools}  # generation 2 needs two slices; one is there
    assert [s["metadata"]["name"] for s in pools[("gpu.nvidia.com", "b")]] == ["b-0"]
    complete = newest_complete([_slice("new-0", "a", 2, count=2), _slice("new-1", "a", 2, count=2)])
    assert len(complete[("gpu.nvidia.com", "a")]) == 2


def test_feature_gates_as_the_chart_renders_them():
    assert parse_feature_gates("DynamicMIG=true,MPSSupport=false,") == {"DynamicMIG": True, "MPSSupport": False}
    assert parse_feature_gates("") == {}


def test_the_stack_follows_what_the_cluster_shows():
    helm = _pod({"dra-driver-nvidia-gpu-component": "kubelet-plugin"}, "TimeSlicingSettings=true,")
    operator = _pod({"app": "nvidia-dra-driver-kubelet-plugin"})
    plain = {"labels": {}, "allocatable": {}, "slices": [], "plugin_pod": None, "gpu_cluster": None}
    assert node_stack(**{**plain, "labels": {"nvidia.com/gpu.deploy.device-plugin": "true"}}) == (DEVICE_PLUGIN, None)
    assert node_stack(**{**plain, "allocatable": {"nvidia.com/gpu": "8"}}) == (DEVICE_PLUGIN, None)
    assert node_stack(**plain) == ("", None)
    assert node_stack(**{**plain, "plugin_pod": helm}) == (DRA_CLUSTER_POLICY, False)
    assert node_stack(**{**plain, "slices": [_slice("s", "n", 1)]}) == (DRA_CLUSTER_POLICY, False)
    dynamic = _pod({"dra-driver-nvidia-gpu-component": "kubelet-plugin"}, "DynamicMIG=true,")
    assert node_stack(**{**plain, "plugin_pod": dynamic}) == (DRA_CLUSTER_POLICY, True)
    counters = _slice("s", "n", 1, sharedCounters=[{"name": "gpu-0-counter-set", "counters": {}}])
    assert node_stack(**{**plain, "slices": [counters]}) == (DRA_CLUSTER_POLICY, True)
    assert node_stack(**{**plain, "plugin_pod": operator}) == (DRA_GPU_CLUSTER, False)
    gpu_cluster = {"spec": {"draDriver": {"featureGates": {"DynamicMIG": True}}}}
    on_gc = {**plain, "slices": [_slice("s", "n", 1)], "gpu_cluster": gpu_cluster}
    assert node_stack(**on_gc) == (DRA_GPU_CLUSTER, True)
