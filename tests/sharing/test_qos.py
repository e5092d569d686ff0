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


GUARANTEED_LIMITS = {"cpu": "1", "memory": "1Gi"}

# Valid pod specs (each request at most its limit, as validation demands) with the class Kubernetes' ComputePodQOS
# gives them; test_render_admission holds the admission CEL to the same table.
QOS_CASES = [
    pytest.param(
        {"containers": [_c({"cpu": "1", "memory": "1Gi"}, {"cpu": "1000m", "memory": "1024Mi"})]},
        GUARANTEED,
        id="quantities-compare-as-numbers",
    ),
    pytest.param(
        {"containers": [_c({"cpu": 2, "memory": 1073741824}, {"cpu": "2", "memory": "1Gi"})]},
        GUARANTEED,
        id="int-or-string-quantities",
    ),
    pytest.param(
        {"containers": [_c(limits={"cpu": "2", "memory": "2Gi"})]}, GUARANTEED, id="requests-default-to-limits"
    ),
    pytest.param(
        {"containers": [_c({"memory": "1Gi"}, GUARANTEED_LIMITS)]}, GUARANTEED, id="missing-cpu-request-defaults"
    ),
    pytest.param(
        {"containers": [_c({"cpu": "1"}, {"cpu": "2", "memory": "1Gi"})]}, BURSTABLE, id="request-below-limit"
    ),
    pytest.param({"containers": [_c({"memory": "1Gi"})]}, BURSTABLE, id="request-only"),
    pytest.param({"containers": [_c(limits={"cpu": "1"})]}, BURSTABLE, id="cpu-limit-only"),
    pytest.param({"containers": [_c(limits={"nvidia.com/gpu": 1})]}, BEST_EFFORT, id="only-cpu-and-memory-count"),
    pytest.param({"containers": [_c()]}, BEST_EFFORT, id="nothing-set"),
    # A zero quantity counts as unset.
    pytest.param({"containers": [_c(limits={"cpu": "0", "memory": "0"})]}, BEST_EFFORT, id="zero-limits"),
    pytest.param({"containers": [_c({"cpu": "0"})]}, BEST_EFFORT, id="zero-request"),
    pytest.param({"containers": [_c({"cpu": "0m", "memory": "0Gi"})]}, BEST_EFFORT, id="zero-with-suffixes"),
    pytest.param({"containers": [_c(limits={"cpu": "0", "memory": "1Gi"})]}, BURSTABLE, id="zero-cpu-limit"),
    pytest.param(
        {"containers": [_c({"cpu": "0", "memory": "0"}, GUARANTEED_LIMITS)]}, BURSTABLE, id="zero-requests-stay-zero"
    ),
    # Init containers count like containers.
    pytest.param(
        {"containers": [_c(limits=GUARANTEED_LIMITS)], "initContainers": [_c(requests={"cpu": "100m"}, name="init")]},
        BURSTABLE,
        id="init-container-burstable",
    ),
    pytest.param(
        {"containers": [_c(limits=GUARANTEED_LIMITS)], "initContainers": [_c(limits=GUARANTEED_LIMITS, name="init")]},
        GUARANTEED,
        id="init-container-guaranteed",
    ),
    pytest.param(
        {"containers": [_c(limits=GUARANTEED_LIMITS)], "initContainers": [_c(name="init")]},
        BURSTABLE,
        id="bare-init-container",
    ),
    pytest.param(
        {"containers": [_c()], "initContainers": [_c({"memory": "64Mi"}, name="init")]},
        BURSTABLE,
        id="only-the-init-container-sets-resources",
    ),
    pytest.param(
        {"containers": [_c()], "initContainers": [_c({"cpu": "0"}, {"memory": "0"}, name="init")]},
        BEST_EFFORT,
        id="init-container-zeros",
    ),
    # Every container needs cpu and memory limits.
    pytest.param(
        {"containers": [_c(limits=GUARANTEED_LIMITS), _c(name="sidecar")]}, BURSTABLE, id="bare-second-container"
    ),
    pytest.param(
        {"containers": [_c(limits=GUARANTEED_LIMITS), _c({"cpu": "500m", "memory": "512Mi"}, name="b")]},
        BURSTABLE,
        id="second-container-requests-only",
    ),
    pytest.param(
        {
            "containers": [
                _c(limits=GUARANTEED_LIMITS),
                _c({"cpu": "2", "memory": "2Gi"}, {"cpu": "2", "memory": "2Gi"}),
            ]
        },
        GUARANTEED,
        id="two-guaranteed-containers",
    ),
    # Pod-level resources with any request or limit decide alone (PodLevelResources).
    pytest.param(
        {"resources": {"limits": {"cpu": "2", "memory": "2Gi"}}, "containers": [_c(), _c(name="b")]},
        GUARANTEED,
        id="pod-level-limits",
    ),
    pytest.param(
        {
            "resources": {"requests": {"cpu": "2000m", "memory": 2147483648}, "limits": {"cpu": "2", "memory": "2Gi"}},
            "containers": [_c({"cpu": "500m"})],
        },
        GUARANTEED,
        id="pod-level-decides-over-containers",
    ),
    pytest.param(
        {"resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "memory": "1Gi"}}, "containers": [_c()]},
        GUARANTEED,
        id="pod-level-memory-request-defaults",
    ),
    pytest.param(
        {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}, "containers": [_c()]},
        BURSTABLE,
        id="pod-level-request-below-limit",
    ),
    pytest.param(
        {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}, "containers": [_c()]},
        BURSTABLE,
        id="pod-level-requests-only",
    ),
    pytest.param(
        {"resources": {"limits": {"memory": "1Gi"}}, "containers": [_c(limits=GUARANTEED_LIMITS)]},
        BURSTABLE,
        id="pod-level-without-cpu-limit",
    ),
    pytest.param(
        {"resources": {"requests": {"cpu": "0"}}, "containers": [_c({"memory": "64Mi"})]},
        BEST_EFFORT,
        id="pod-level-zero-request",
    ),
    pytest.param(
        {"resources": {"requests": {}, "limits": {}}, "containers": [_c(limits=GUARANTEED_LIMITS)]},
        GUARANTEED,
        id="empty-pod-level-resources",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), QOS_CASES)
def test_qos_class_follows_kubernetes_rules(spec, expected):
    assert qos_class(spec) == expected


def test_guaranteed_compares_summed_requests_with_summed_limits():
    # ComputePodQOS sums before comparing. Only a spec validation refuses (a request above its limit) tells the sums
    # from a per-container comparison, so the admission CEL compares per container.
    over, under = _c({"cpu": "2"}, {"cpu": "1", "memory": "1Gi"}), _c({"cpu": "1"}, {"cpu": "2", "memory": "1Gi"}, "b")
    assert qos_class({"containers": [over, under]}) == GUARANTEED
    assert qos_class({"containers": [over, _c({"cpu": "1"}, {"cpu": "3", "memory": "1Gi"}, "b")]}) == BURSTABLE


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
