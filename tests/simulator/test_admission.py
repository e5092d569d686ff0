"""admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies and bindings in the simulator: discovery, create,
get, list by label, replace with resourceVersion preconditions, patch, delete, the defaults and validation errors of
a real API server, the `unserved` knob (an API server older than 1.30), and kubectl's tables."""

import json
import os
import shutil
import subprocess

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sharing.render import render_admission_policy
from simulator.resources import VALIDATING_ADMISSION_POLICIES

MANAGED = "app.kubernetes.io/managed-by=tessera"
NOT_SERVED = ["validatingadmissionpolicies.admissionregistration.k8s.io"]
KUBECTL = shutil.which("kubectl")


@pytest.fixture
def vap(k8s):
    return client.AdmissionregistrationV1Api(k8s)


def pair(name="tessera-gpu-qos", **options):
    options = {"required_qos": "guaranteed", "required_priority_class": "", **options}
    return render_admission_policy(name, node_pool_label="tessera.io/pool=inference", **options)


def raw(response) -> dict:
    return json.loads(response.data)


def test_discovery_lists_both_kinds_for_the_official_client(vap):
    resources = {r.name: r for r in vap.get_api_resources().resources}
    assert set(resources) == {"validatingadmissionpolicies", "validatingadmissionpolicybindings"}
    assert resources["validatingadmissionpolicies"].kind == "ValidatingAdmissionPolicy"
    assert not resources["validatingadmissionpolicybindings"].namespaced
    groups = client.ApisApi(vap.api_client).get_api_versions().groups
    assert "admissionregistration.k8s.io" in {g.name for g in groups}


def test_create_get_list_by_label_and_delete(vap):
    policy, binding = pair()
    created = vap.create_validating_admission_policy(policy)
    vap.create_validating_admission_policy_binding(binding)
    vap.create_validating_admission_policy(pair("someone-elses")[0] | {"metadata": {"name": "someone-elses"}})
    assert created.metadata.labels == {"app.kubernetes.io/managed-by": "tessera"} and created.metadata.uid

    got = vap.read_validating_admission_policy("tessera-gpu-qos")
    assert got.metadata.resource_version == created.metadata.resource_version
    assert got.spec.validations[0].reason == "Forbidden"
    listed = vap.list_validating_admission_policy(label_selector=MANAGED)
    assert [p.metadata.name for p in listed.items] == ["tessera-gpu-qos"]
    assert len(vap.list_validating_admission_policy().items) == 2
    assert vap.read_validating_admission_policy_binding("tessera-gpu-qos").spec.policy_name == "tessera-gpu-qos"

    with pytest.raises(ApiException) as exists:
        vap.create_validating_admission_policy(policy)
    assert exists.value.status == 409 and json.loads(exists.value.body)["reason"] == "AlreadyExists"

    vap.delete_validating_admission_policy_binding("tessera-gpu-qos")
    vap.delete_validating_admission_policy("tessera-gpu-qos")
    with pytest.raises(ApiException) as gone:
        vap.read_validating_admission_policy("tessera-gpu-qos")
    assert gone.value.status == 404
    assert vap.list_validating_admission_policy_binding(label_selector=MANAGED).items == []


def test_replace_honours_resource_version_and_a_same_content_write_keeps_it(sim, vap):
    policy, _ = pair()
    version = vap.create_validating_admission_policy(policy).metadata.resource_version
    stored = raw(vap.read_validating_admission_policy("tessera-gpu-qos", _preload_content=False))
    same = raw(vap.replace_validating_admission_policy("tessera-gpu-qos", stored, _preload_content=False))
    assert same["metadata"]["resourceVersion"] == version  # a no-op write changes nothing

    changed, _ = pair(required_qos="burstable")
    changed["metadata"]["resourceVersion"] = version
    replaced = vap.replace_validating_admission_policy("tessera-gpu-qos", changed)
    assert replaced.metadata.resource_version != version and "Burstable" in replaced.spec.validations[0].message
    with pytest.raises(ApiException) as stale:
        vap.replace_validating_admission_policy("tessera-gpu-qos", changed)  # the old version again
    assert stale.value.status == 409 and json.loads(stale.value.body)["reason"] == "Conflict"

    patched = vap.patch_validating_admission_policy(
        "tessera-gpu-qos",
        {"metadata": {"labels": {"team": "ml"}}, "spec": {"failurePolicy": "Ignore"}},
        _content_type="application/merge-patch+json",
    )
    assert patched.spec.failure_policy == "Ignore" and patched.metadata.labels["team"] == "ml"
    assert sim.store.find(VALIDATING_ADMISSION_POLICIES, "", "tessera-gpu-qos")["spec"]["failurePolicy"] == "Ignore"


def test_the_server_fills_in_defaults_and_keeps_status_read_only(vap):
    policy, binding = pair()
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {"gpu": "true"}}}
    stored = raw(vap.create_validating_admission_policy(policy, _preload_content=False))
    match = stored["spec"]["matchConstraints"]
    assert stored["spec"]["failurePolicy"] == "Fail"
    assert (match["matchPolicy"], match["objectSelector"], match["resourceRules"][0]["scope"]) == (
        "Equivalent",
        {},
        "*",
    )
    bound = raw(vap.create_validating_admission_policy_binding(binding, _preload_content=False))
    assert bound["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"gpu": "true"}}
    assert bound["spec"]["matchResources"]["matchPolicy"] == "Equivalent"

    stored["status"] = {"observedGeneration": 9}
    kept = raw(vap.replace_validating_admission_policy("tessera-gpu-qos", stored, _preload_content=False))
    assert "status" not in kept


def test_objects_the_real_server_refuses_are_422(vap):
    policy, binding = pair()
    policy["spec"]["validations"] = []
    policy["spec"]["variables"].append({"name": "containers", "expression": "1"})
    with pytest.raises(ApiException) as invalid:
        vap.create_validating_admission_policy(policy)
    status = json.loads(invalid.value.body)
    assert invalid.value.status == 422 and status["reason"] == "Invalid"
    assert "validations or auditAnnotations must contain at least one item" in status["message"]
    assert 'spec.variables[3].name: Duplicate value: "containers"' in status["message"]

    binding["spec"]["validationActions"] = ["Deny", "Warn"]
    with pytest.raises(ApiException) as refused:
        vap.create_validating_admission_policy_binding(binding)
    assert refused.value.status == 422 and "Deny and Warn may not be used together" in refused.value.body


def test_the_unserved_knob_makes_an_older_api_server(sim, vap):
    sim.faults.update({"unserved": NOT_SERVED})
    assert {r.name for r in vap.get_api_resources().resources} == {"validatingadmissionpolicybindings"}
    with pytest.raises(ApiException) as missing:
        vap.list_validating_admission_policy()
    assert missing.value.status == 404
    assert "could not find the requested resource" in json.loads(missing.value.body)["message"]
    with pytest.raises(ApiException):
        vap.create_validating_admission_policy(pair()[0])
    sim.faults.update({"unserved": []})
    assert vap.list_validating_admission_policy().items == []


@pytest.mark.kubectl
def test_kubectl_gets_the_policies_by_label(sim, vap, tmp_path):
    if KUBECTL is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is required in CI")
        pytest.skip("kubectl is not installed")
    policy, binding = pair()
    vap.create_validating_admission_policy(policy)
    vap.create_validating_admission_policy_binding(binding)
    vap.create_validating_admission_policy(pair("other")[0] | {"metadata": {"name": "other"}})

    def kubectl(*args: str) -> list[list[str]]:
        command = [KUBECTL, "--kubeconfig", sim.kubeconfig_path, "--cache-dir", str(tmp_path / "cache"), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return [line.split() for line in result.stdout.strip().splitlines()]

    table = kubectl("get", "validatingadmissionpolicies", "-l", MANAGED)
    assert table[0] == ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"]
    assert [row[:3] for row in table[1:]] == [["tessera-gpu-qos", "1", "<unset>"]]
    bindings = kubectl("get", "validatingadmissionpolicybindings", "-l", MANAGED, "-L", "app.kubernetes.io/managed-by")
    assert bindings[0] == ["NAME", "POLICYNAME", "PARAMREF", "AGE", "MANAGED-BY"]
    assert bindings[1][:3] == ["tessera-gpu-qos", "tessera-gpu-qos", "<unset>"] and bindings[1][-1] == "tessera"
    names = kubectl("get", "validatingadmissionpolicy", "-o", "name")
    assert names == [
        ["validatingadmissionpolicy.admissionregistration.k8s.io/other"],
        ["validatingadmissionpolicy.admissionregistration.k8s.io/tessera-gpu-qos"],
    ]
