"""ValidatingAdmissionPolicy rendering: golden files, the structure the API server checks, and what the CEL decides.

The CEL runs in cel-python (celpy) with a stand-in for Kubernetes' quantity library, against the table of pod specs
that pins sharing.qos.qos_class: the policy must admit exactly the pods of the required class. celpy does not
type-check against the Pod schema as the API server does; that is verified only against a real cluster.
"""

import copy
import os
import re
from pathlib import Path

import celpy
import pytest
import yaml
from celpy import celtypes

from sharing.qos import BEST_EFFORT, GUARANTEED, parse_quantity, qos_class
from sharing.render import ADMISSION_API_VERSION, render_admission_manifests, render_admission_policy
from tests.sharing.test_qos import QOS_CASES

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "admission_guaranteed_pool": dict(
        name="gpu-inference-qos",
        required_qos="guaranteed",
        required_priority_class="inference-high",
        namespace_selector={"matchLabels": {"tessera.io/gpu-workloads": "true"}},
        node_pool_label="tessera.io/pool=inference",
    ),
    "admission_burstable": dict(name="gpu-batch-qos", required_qos="burstable", required_priority_class=""),
    "admission_priority_any_pool_value": dict(
        name="gpu-priority",
        required_qos="any",
        required_priority_class="batch-low",
        node_pool_label="tessera.io/pool",
    ),
}
CEL_FUNCTIONS = {"has", "all", "exists", "startsWith", "size", "quantity", "compareTo", "isGreaterThan", "string"}
_TOKEN_RE = re.compile(
    r"\s+|'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|&&|\|\||==|!=|<=|>=|[A-Za-z_][A-Za-z0-9_]*|\d+|[()\[\]{}.,?:!<>+\-]"
)


def cel_tokens(expression: str) -> list[str]:
    """Split CEL into tokens; anything outside the grammar we use (an unclosed quote, a stray character) fails."""
    tokens, position = [], 0
    while position < len(expression):
        match = _TOKEN_RE.match(expression, position)
        assert match, f"cannot read CEL at {position}: {expression[position : position + 30]!r}"
        if not match.group().isspace():
            tokens.append(match.group())
        position = match.end()
    return tokens


def check_cel(expression: str, variables: set[str]) -> None:
    """Shape checks standing in for a CEL compiler (see the module docstring)."""
    tokens = cel_tokens(expression)
    stack = []
    pairs = {")": "(", "]": "[", "}": "{"}
    binary = {"&&", "||", "==", "!=", "<=", ">=", "<", ">", "+", "in"}
    for i, token in enumerate(tokens):
        if token in "([{":
            stack.append(token)
        elif token in pairs:
            assert stack and stack.pop() == pairs[token], f"unbalanced {token} at token {i} of {expression!r}"
        if token in binary:
            assert 0 < i < len(tokens) - 1, f"{token} without two operands in {expression!r}"
            assert tokens[i - 1] not in binary | {"(", "[", ",", "!"}, f"operator before {token} in {expression!r}"
            assert tokens[i + 1] not in binary | {")", "]", ","}, f"nothing after {token} in {expression!r}"
        if token == "(" and i > 0 and re.fullmatch(r"[A-Za-z_]\w*", tokens[i - 1]) and tokens[i - 1] not in binary:
            assert tokens[i - 1] in CEL_FUNCTIONS, f"unknown function {tokens[i - 1]} in {expression!r}"
        if token == "variables":
            assert tokens[i + 1] == "." and tokens[i + 2] in variables, f"undefined variable in {expression!r}"
    assert not stack, f"unclosed {''.join(stack)} in {expression!r}"


def golden_path(case: str) -> Path:
    return GOLDEN / f"{case}.yaml"


@pytest.mark.parametrize("case", sorted(CASES))
def test_admission_golden(case):
    text = render_admission_manifests(*render_admission_policy(**CASES[case]))
    if os.environ.get("UPDATE_GOLDEN"):
        golden_path(case).write_text(text)
    assert text == golden_path(case).read_text()
    assert list(yaml.safe_load_all(text)) == list(render_admission_policy(**CASES[case]))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_objects_have_the_shape_the_api_server_validates(case):
    policy, binding = render_admission_policy(**CASES[case])
    name = CASES[case]["name"]
    assert (policy["apiVersion"], policy["kind"]) == (ADMISSION_API_VERSION, "ValidatingAdmissionPolicy")
    assert (binding["apiVersion"], binding["kind"]) == (ADMISSION_API_VERSION, "ValidatingAdmissionPolicyBinding")
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == binding["spec"]["policyName"] == name
    assert set(policy) == set(binding) == {"apiVersion", "kind", "metadata", "spec"}
    spec = policy["spec"]
    assert set(spec) == {"failurePolicy", "matchConstraints", "variables", "validations"}
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"] == {
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    }
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert set(binding["spec"]) <= {"policyName", "validationActions", "matchResources"}
    defined = set()
    for variable in spec["variables"]:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable["name"])  # a CEL identifier
        check_cel(variable["expression"], defined)  # may use only the variables before it
        defined.add(variable["name"])
    assert spec["validations"]
    for validation in spec["validations"]:
        assert set(validation) == {"expression", "message", "reason"} and validation["reason"] == "Forbidden"
        check_cel(validation["expression"], defined)
        assert validation["expression"].startswith("!variables.requestsGpu || ")  # pods without GPUs pass
        assert "\n" not in validation["message"] and len(validation["message"]) < 1024
        assert re.search(rf"^Tessera QoS policy {name} \(rule (qos|priority)\): ", validation["message"])


def test_each_rule_is_its_own_validation_named_in_its_message():
    policy, _ = render_admission_policy(**CASES["admission_guaranteed_pool"])
    qos, priority = policy["spec"]["validations"]
    assert "(rule qos)" in qos["message"] and "must be Guaranteed" in qos["message"]
    assert "quantity(string(c.resources.requests[r])).compareTo" in qos["expression"]
    assert "on nodes selected by tessera.io/pool=inference" in qos["message"]
    assert "(rule priority)" in priority["message"] and "must use priority class inference-high" in priority["message"]
    assert priority["expression"].endswith("object.spec.priorityClassName == 'inference-high')")
    assert [v["name"] for v in policy["spec"]["variables"]] == ["containers", "requestsGpu", "inPool"]
    gpu = policy["spec"]["variables"][1]["expression"]
    for resource in ("'nvidia.com/gpu'", "'nvidia.com/gpu.shared'", "r.startsWith('nvidia.com/mig-')"):
        assert resource in gpu
    assert "initContainers" in policy["spec"]["variables"][0]["expression"]

    burstable, _ = render_admission_policy(**CASES["admission_burstable"])
    (rule,) = burstable["spec"]["validations"]
    assert "must be Burstable or Guaranteed" in rule["message"] and "inPool" not in rule["expression"]


def test_the_pool_matches_node_selectors_and_required_node_affinity():
    policy, _ = render_admission_policy(**CASES["admission_guaranteed_pool"])
    in_pool = policy["spec"]["variables"][2]["expression"]
    assert "object.spec.nodeSelector['tessera.io/pool'] == 'inference'" in in_pool
    assert "requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.exists(t" in in_pool
    assert "e.operator == 'In'" in in_pool and "'inference' in e.values" in in_pool
    any_value, _ = render_admission_policy(**CASES["admission_priority_any_pool_value"])
    assert "e.operator == 'Exists'" in any_value["spec"]["variables"][2]["expression"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(name="Bad_Name", required_qos="guaranteed", required_priority_class=""), "not a Kubernetes object name"),
        (dict(name="p", required_qos="strict", required_priority_class=""), "required_qos must be one of"),
        (dict(name="p", required_qos="any", required_priority_class=""), "nothing to enforce"),
        (dict(name="p", required_qos="any", required_priority_class="x'y"), "is not a PriorityClass name"),
        (
            dict(name="p", required_qos="guaranteed", required_priority_class="", node_pool_label="a=b,c=d"),
            "node_pool_label must be one label",
        ),
        (
            dict(name="p", required_qos="guaranteed", required_priority_class="", node_pool_label="pool=in'jected"),
            "node_pool_label must be one label",
        ),
        (
            dict(name="p", required_qos="guaranteed", required_priority_class="", namespace_selector={"names": ["a"]}),
            "namespace_selector must be a label selector",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_is_rendered(options, message):
    with pytest.raises(ValueError, match=message):
        render_admission_policy(**options)


def test_the_shape_checker_catches_what_it_is_for():
    check_cel("has(object.spec.x) && (a || b)", set())
    for broken in ("has(object.spec.x", "a || b)", "a && || b", "'unclosed", "nosuch(x)", "variables.missing"):
        with pytest.raises(AssertionError):
            check_cel(broken, set())


# --- what the CEL decides ----------------------------------------------------------------------------------------


class Quantity:
    """The part of Kubernetes' CEL quantity library (k8s.io/apiserver/pkg/cel/library) the policy uses."""

    def __init__(self, text: str):
        self.value = parse_quantity(text)


CEL_LIBRARY = {
    "quantity": Quantity,
    "compareTo": lambda a, b: celtypes.IntType((a.value > b.value) - (a.value < b.value)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > b.value),
}


def admits(policy: dict, pod: dict) -> bool:
    """Whether the API server would let `pod` in: each variable bound in order, then every validation holds."""
    env = celpy.Environment()
    variables = celtypes.MapType()
    activation = {"object": celpy.json_to_cel(pod), "variables": variables}

    def run(expression: str):
        return env.program(env.compile(expression), functions=CEL_LIBRARY).evaluate(activation)

    for variable in policy["spec"]["variables"]:
        variables[celtypes.StringType(variable["name"])] = run(variable["expression"])
    verdicts = [run(validation["expression"]) for validation in policy["spec"]["validations"]]
    assert all(isinstance(verdict, celtypes.BoolType) for verdict in verdicts), verdicts
    return all(verdicts)


def with_gpu(spec: dict) -> dict:
    """`spec` in a pod whose first container asks for a GPU, so the policy applies to it."""
    spec = copy.deepcopy(spec)
    resources = spec["containers"][0].setdefault("resources", {})
    resources.setdefault("limits", {})["nvidia.com/gpu"] = 1
    return {"spec": spec}


GUARANTEED_POLICY, _ = render_admission_policy("gpu-qos", required_qos="guaranteed", required_priority_class="")
BURSTABLE_POLICY, _ = render_admission_policy("gpu-qos", required_qos="burstable", required_priority_class="")


@pytest.mark.parametrize(("spec", "expected"), QOS_CASES)
def test_the_cel_admits_exactly_the_pods_of_the_required_class(spec, expected):
    pod = with_gpu(spec)
    assert qos_class(pod["spec"]) == expected  # a GPU limit does not change the class
    assert admits(GUARANTEED_POLICY, pod) == (expected == GUARANTEED)
    assert admits(BURSTABLE_POLICY, pod) == (expected != BEST_EFFORT)


def test_pods_without_gpus_are_not_checked():
    assert admits(GUARANTEED_POLICY, {"spec": {"containers": [{"name": "c"}]}})
    assert not admits(GUARANTEED_POLICY, with_gpu({"containers": [{"name": "c"}]}))
