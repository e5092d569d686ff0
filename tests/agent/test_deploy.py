"""The agent's deployment files say what the agent needs: host PIDs, privileges, the NVIDIA runtime, its state."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _documents(name):
    path = ROOT / "deploy" / "overlays" / "agent-only" / name
    return {doc["kind"]: doc for doc in yaml.safe_load_all(path.read_text())}


def test_daemonset_runs_the_agent_privileged_on_gpu_nodes_with_a_host_state_dir():
    daemonset = _documents("agent-daemonset.yaml")["DaemonSet"]
    assert (daemonset["kind"], daemonset["metadata"]["namespace"]) == ("DaemonSet", "tessera-system")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "agent"]
    assert container["securityContext"]["privileged"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]
    env = {item["name"]: item for item in container["env"]}
    for name, key in (("TESSERA_SERVER", "server"), ("TESSERA_JOIN_TOKEN", "join-token")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "tessera-agent-join", "key": key}
    assert env["TESSERA_HOSTNAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert volumes["state"]["hostPath"]["path"] == mounts["state"] == "/var/lib/tessera-agent"
    assert selector_matches(daemonset)


def test_daemonset_agents_present_their_pods_service_account_token_for_tessera_only():
    documents = _documents("agent-daemonset.yaml")
    pod = documents["DaemonSet"]["spec"]["template"]["spec"]
    account = documents["ServiceAccount"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "tessera-agent"
    assert pod["automountServiceAccountToken"] is False and account["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    (source,) = {volume["name"]: volume for volume in pod["volumes"]}["tessera-token"]["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["audience"] == "tessera" and token["expirationSeconds"] <= 3600
    assert env["TESSERA_SERVICE_ACCOUNT_TOKEN_FILE"] == f"{mounts['tessera-token']}/{token['path']}"
    (rule,) = documents["ClusterRole"]["rules"]
    assert rule == {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    assert documents["ClusterRoleBinding"]["roleRef"]["name"] == documents["ClusterRole"]["metadata"]["name"]


def selector_matches(daemonset):
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(key) == value for key, value in daemonset["spec"]["selector"]["matchLabels"].items())


def test_systemd_unit_restarts_the_agent_with_a_join_token_file():
    unit = (ROOT / "deploy/tessera-agent.service").read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", unit, re.MULTILINE)
    assert re.search(r"python3 -m agent --server \S+ --join-token-file /etc/tessera/join-token", exec_start)
    assert exec_start.endswith("--state-dir /var/lib/tessera-agent")
    assert "Restart=always" in unit.splitlines() and "RestartPreventExitStatus=3" in unit.splitlines()
    assert "WorkingDirectory=/opt/tessera" in unit.splitlines()  # where agent/ and sharing/ are installed


def test_agent_requirements_are_nvml_and_yaml_only():
    lines = [line for line in (ROOT / "agent/requirements.txt").read_text().splitlines() if not line.startswith("#")]
    assert [line.split("==")[0] for line in lines if line] == ["nvidia-ml-py", "PyYAML"]
