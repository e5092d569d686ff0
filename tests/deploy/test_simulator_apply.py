"""`kubectl apply` of each rendered overlay on the simulator, for the kinds it serves with create (issue 19, point 1):
the simulator emulates the API of a GPU cluster, not a whole one, so Deployments, RBAC and the like are checked
against the API schema (test_manifests.py) and only Namespaces and ConfigMaps are applied here. A second apply
changes nothing; a changed setting is applied in place."""

import json
import subprocess

import pytest
import yaml

from simulator import resources
from tests.deploy.manifests import OVERLAYS, kubectl, render

CREATABLE = {(r.api_version, r.kind) for r in resources.ALL if "create" in r.verbs}


@pytest.fixture
def apply(sim, tmp_path):
    def run(objects: list[dict], *args: str) -> list[str]:
        manifest = tmp_path / "manifest.yaml"
        manifest.write_text(yaml.safe_dump_all(objects))
        command = [kubectl(), "--kubeconfig", sim.kubeconfig_path, "--cache-dir", str(tmp_path / "cache"), *args]
        # Client-side validation needs OpenAPI schemas the simulator does not publish; the schema is checked offline.
        result = subprocess.run(
            [*command, "apply", "--validate=false", "-f", str(manifest)], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    return run


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_namespaces_and_configmaps_apply_to_the_simulator(overlay, apply, core):
    objects = [o for o in render(overlay) if (o["apiVersion"], o["kind"]) in CREATABLE]
    assert {o["kind"] for o in objects} == {"Namespace", "ConfigMap"}
    assert apply(objects) == ["namespace/tessera-system created", "configmap/tessera created"]
    assert apply(objects) == ["namespace/tessera-system unchanged", "configmap/tessera unchanged"]
    (config,) = (o for o in objects if o["kind"] == "ConfigMap")
    stored = core.read_namespaced_config_map("tessera", "tessera-system")
    assert stored.data == config["data"] and stored.metadata.labels == config["metadata"]["labels"]
    last_applied = json.loads(stored.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"])
    assert last_applied["data"] == config["data"]
    config["data"]["TESSERA_READYZ_REQUIRED"] = "database"  # an admin's overlay changes a setting
    assert apply(objects) == ["namespace/tessera-system unchanged", "configmap/tessera configured"]
    assert core.read_namespaced_config_map("tessera", "tessera-system").data["TESSERA_READYZ_REQUIRED"] == "database"
