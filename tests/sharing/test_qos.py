"""Pod QoS classes per Kubernetes' rules, workload checks, and policy consistency (pure)."""

import pytest

from sharing.qos import (
    BEST_EFFORT,
    BURSTABLE,
    GUARANTEED,
    PodView,
    PolicySpec,
    WorkloadRules,
    check_pods,
    consistency_errors,
    parse_quantity,
    parse_taint,
    qos_class,
)


def _c(requests=None, limits=None, name="c"):
    return {"name": name, "resources": {"requests": requests or {}, "limits": limits or {}}}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [_c({"cpu": "1", "memory": "1Gi"}, {"cpu": "1000m", "memory": "1024Mi"})]}, GUARANTEED),
        ({"containers": [_c(limits={"cpu": "2", "memory": "2Gi"})]}, GUARANTEED),  # requests default to limits
        ({"containers": [_c({"cpu": "1"}, {"cpu": "2", "memory": "1Gi"})]}, BURSTABLE),
        ({"containers": [_c({"memory": "1Gi"})]}, BURSTABLE),
        ({"containers": [_c(limits={"nvidia.com/gpu": 1})]}, BEST_EFFORT),  # only cpu and memory count
        ({"containers": [_c()]}, BEST_EFFORT),
        (
            {
                "containers": [_c(limits={"cpu": "1", "memory": "1Gi"})],
                "initContainers": [_c(requests={"cpu": "100m"}, name="init")],
            },
            BURSTABLE,
        ),
        (
            {
                "containers": [_c(limits={"cpu": "1", "memory": "1Gi"})],
                "initContainers": [_c(limits={"cpu": "1", "memory": "1Gi"}, name="init")],
            },
            GUARANTEED,
        ),
        ({"containers": [_c(limits={"cpu": "1", "memory": "1Gi"}), _c(name="sidecar")]}, BURSTABLE),
    ],
)
def test_qos_class_follows_kubernetes_rules(spec, expected):
    assert qos_class(spec) == expected


def test_quantities():
    assert parse_quantity("1") == parse_quantity("1000m")
    assert parse_quantity("1Gi") == parse_quantity("1024Mi") == 2**30
    assert parse_quantity("1e3") == 1000
    with pytest.raises(ValueError):
        parse_quantity("1Gb")


def _pod(name, spec=None, node="n1", **kw):
    return PodView("ml", name, node, spec or {"containers": [_c()]}, **kw)


def test_workload_rules_flag_the_right_pods():
    guaranteed = {"containers": [_c(limits={"cpu": "1", "memory": "1Gi"})], "priorityClassName": "inference"}
    rules = WorkloadRules(required_qos="guaranteed", required_priority_class="inference")
    violations = check_pods(rules, [_pod("good", guaranteed), _pod("besteffort")], {"n1": 1})
    assert {(v.name, v.rule) for v in violations} == {("besteffort", "qos"), ("besteffort", "priority")}
    assert "QoS class BestEffort; the pool requires Guaranteed" in violations[0].message


def test_max_pods_per_gpu_and_exclusive_taint():
    shared = [_pod(f"p{i}", gpu_resources={"nvidia.com/gpu.shared": 1}) for i in range(5)]
    violations = check_pods(WorkloadRules(max_pods_per_gpu=2), shared, {"n1": 2})
    assert [v.name for v in violations] == ["p4"]
    taint = "tessera.io/pool=inference:NoSchedule"
    tolerant = {"containers": [_c()], "tolerations": [{"key": "tessera.io/pool", "operator": "Exists"}]}
    violations = check_pods(WorkloadRules(exclusive_taint=taint), [_pod("ok", tolerant), _pod("no")], {})
    assert [(v.name, v.rule) for v in violations] == [("no", "exclusive")]
    with pytest.raises(ValueError, match="key=value:NoSchedule"):
        parse_taint("tessera.io/pool")


def test_consistency_checks():
    assert (
        "use MIG"
        in consistency_errors(PolicySpec(requires_memory_isolation=True), "time_slicing")["requires_memory_isolation"][
            0
        ]
    )
    assert consistency_errors(PolicySpec(requires_memory_isolation=True), "mig") == {}
    assert "mps_active_thread_percentage" in consistency_errors(PolicySpec(mps_active_thread_percentage=50), "mig")
    assert consistency_errors(PolicySpec(mps_active_thread_percentage=50), "mps") == {}
