"""Every overlay of deploy/ renders, fits the Kubernetes API schema, and runs Tessera as README and
docs/operations.md say: migrations before new pods, one beat, one watcher, probes, limits, non-root, read-only root
filesystems, secrets by reference, and Services, Ingress, ServiceMonitor, budgets and network policies that select
what they are meant to (issue 19, point 1)."""

import copy
import os
import re

import pytest
from pydantic import ValidationError

from tests.deploy.manifests import COMPONENTS, DEPLOY, OVERLAYS, ROOT, _render, by_kind, render, validate

SECRET_KEYS = {"DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL", "TESSERA_METRICS_TOKEN", "TESSERA_OIDC_CLIENT_SECRET"}


def _pods(objects):
    """(owner name, pod template) of every workload."""
    return [
        (o["metadata"]["name"], o["spec"]["template"])
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet", "Job", "StatefulSet")
    ]


def _selects(selector: dict, labels: dict) -> bool:
    expressions = selector.get("matchExpressions", [])
    assert {e["operator"] for e in expressions} <= {"In"}, expressions
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        labels.get(e["key"]) in e["values"] for e in expressions
    )


def test_overlays_and_components_exist():
    assert OVERLAYS == ["agent-only", "gpu-operator"]
    assert COMPONENTS == ["admission", "kueue"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_fits_the_kubernetes_api_schema(overlay):
    objects = render(overlay)
    assert len(objects) >= 18
    for obj in objects:
        validate(obj)


def test_components_render_onto_the_gpu_operator_overlay_and_fit_the_schema(tmp_path):
    objects = render("gpu-operator", *COMPONENTS, tmp_path=tmp_path)
    assert {"tessera", "tessera-admission"} <= set(by_kind(objects, "ClusterRole"))
    for obj in objects:
        validate(obj)


@pytest.mark.parametrize(
    "mutate, error",
    [
        (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolcy="Always"), ValidationError),
        (lambda d: d["spec"].pop("selector"), ValidationError),
        (lambda d: d["spec"].update(replicas="2"), ValidationError),
        (lambda d: d.update(apiVersion="extensions/v1"), AssertionError),  # no such group/version for the kind
    ],
    ids=["unknown field", "missing required field", "wrong type", "wrong apiVersion"],
)
def test_the_schema_check_refuses_a_broken_deployment(mutate, error):
    web = copy.deepcopy(by_kind(render("gpu-operator"), "Deployment")["tessera-web"])
    validate(web)
    mutate(web)
    with pytest.raises(error):
        validate(web)


def test_the_schema_check_refuses_a_broken_service_monitor():
    monitor = copy.deepcopy(by_kind(render("gpu-operator"), "ServiceMonitor")["tessera"])
    monitor["spec"]["endpoints"][0]["bearerTokenFile"] = "/var/run/token"  # not a field Tessera's check knows
    with pytest.raises(ValidationError):
        validate(monitor)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tessera_pods_are_probed_limited_non_root_read_only_and_read_secrets_by_reference(overlay):
    objects = render(overlay)
    assert not by_kind(objects, "Secret"), "secrets are created by the admin, never shipped"
    pods = [(name, t) for name, t in _pods(objects) if t["metadata"]["labels"].get("app") == "tessera"]
    assert {name for name, _ in pods} == {"tessera-web", "tessera-worker", "tessera-beat", "tessera-watcher",
                                          "tessera-migrate"}  # fmt: skip
    for name, template in pods:
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0, name
        for container in spec["containers"] + spec.get("initContainers", []):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, (name, container["name"])
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]
            for env in container.get("env", []):
                if env["name"] in SECRET_KEYS:
                    assert "value" not in env and env["valueFrom"]["secretKeyRef"]["name"] == "tessera", env
            assert not [e for e in container.get("envFrom", []) if "secretRef" in e], "each secret by its key"
        writable = {m["mountPath"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        assert {"/tmp", "/app/var"} <= writable, name  # scratch space on an emptyDir
    web = by_kind(objects, "Deployment")["tessera-web"]["spec"]["template"]["spec"]["containers"][0]
    assert web["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert web["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_exactly_one_beat_and_one_watcher_never_two_during_an_upgrade(overlay):
    deployments = by_kind(render(overlay), "Deployment")
    for name, command in (("tessera-beat", "beat"), ("tessera-watcher", "watch_clusters")):
        spec = deployments[name]["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}, name
        assert command in spec["template"]["spec"]["containers"][0]["command"]
    runs = [
        d for d in deployments.values() if "watch_clusters" in d["spec"]["template"]["spec"]["containers"][0]["command"]
    ]
    assert len(runs) == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_migrations_run_in_the_job_and_every_new_pod_waits_for_them(overlay):
    objects = render(overlay)
    job = by_kind(objects, "Job")["tessera-migrate"]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["python", "manage.py", "migrate",
                                                                           "--noinput"]  # fmt: skip
    for name, deployment in by_kind(objects, "Deployment").items():
        spec = deployment["spec"]["template"]["spec"]
        (wait,) = spec["initContainers"]
        assert "manage.py migrate --check" in " ".join(wait["command"]), name
        assert "migrate" not in " ".join(spec["containers"][0]["command"]), name  # only the Job migrates
        assert wait["image"] == spec["containers"][0]["image"], "the schema of the image that will run"
    web = by_kind(objects, "Deployment")["tessera-web"]["spec"]
    assert web["strategy"]["rollingUpdate"]["maxUnavailable"] == 0  # the old pods serve until the new are Ready


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_ingress_monitor_budgets_and_policies_select_what_they_mean(overlay):
    objects = render(overlay)
    pods = {name: t["metadata"]["labels"] for name, t in _pods(objects)}
    service = by_kind(objects, "Service")["tessera-web"]
    web = by_kind(objects, "Deployment")["tessera-web"]["spec"]["template"]
    assert [n for n, labels in pods.items() if _selects({"matchLabels": service["spec"]["selector"]}, labels)] == [
        "tessera-web"
    ]
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in web["spec"]["containers"][0]["ports"]}
    ingress = by_kind(objects, "Ingress")["tessera"]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "tessera-web", "port": {"name": service["spec"]["ports"][0]["name"]}}
    monitor = by_kind(objects, "ServiceMonitor")["tessera"]["spec"]
    assert _selects(monitor["selector"], service["metadata"]["labels"])
    assert monitor["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    token = monitor["endpoints"][0]["authorization"]["credentials"]
    env = {e["name"]: e for e in web["spec"]["containers"][0]["env"]}
    assert env["TESSERA_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == token["key"]
    budgets = by_kind(objects, "PodDisruptionBudget")
    assert set(budgets) == {"tessera-web", "tessera-worker"}  # single-replica beat and watcher never block a drain
    for name, budget in budgets.items():
        assert [n for n, labels in pods.items() if _selects(budget["spec"]["selector"], labels)] == [name]
    covered = {}
    for policy in by_kind(objects, "NetworkPolicy").values():
        for name, labels in pods.items():
            if _selects(policy["spec"]["podSelector"], labels):
                covered[name] = policy["spec"].get("ingress", [])
    assert set(covered) >= {"tessera-web", "tessera-worker", "tessera-beat", "tessera-watcher", "tessera-migrate"}
    assert covered["tessera-web"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert all(rules == [] for name, rules in covered.items() if name != "tessera-web")


def test_the_agent_daemonset_comes_with_the_agent_only_overlay():
    assert "tessera-agent" in by_kind(render("agent-only"), "DaemonSet")
    assert not by_kind(render("gpu-operator"), "DaemonSet")


def test_the_overlay_of_docs_install_renders_with_its_image_and_host(tmp_path):
    text = (ROOT / "docs" / "install.md").read_text()
    (block,) = re.findall(r"```yaml\n(# my-tessera/kustomization\.yaml\n.*?)```", text, flags=re.S)
    checkout = os.path.relpath(DEPLOY.parent, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(block.replace("../tessera/", f"{checkout}/"))
    objects = list(_render(tmp_path))
    for obj in objects:
        validate(obj)
    images = {
        c["image"] for _, t in _pods(objects) for c in t["spec"]["containers"] + t["spec"].get("initContainers", [])
    }
    assert images == {"registry.example.com/tessera:1.0"}
    assert by_kind(objects, "ConfigMap")["tessera"]["data"]["DJANGO_ALLOWED_HOSTS"] == "tessera.corp.example"
    assert by_kind(objects, "Ingress")["tessera"]["spec"]["rules"][0]["host"] == "tessera.corp.example"
