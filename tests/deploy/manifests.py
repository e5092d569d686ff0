"""The Kubernetes manifests as an admin applies them: every overlay of deploy/ rendered by `kubectl kustomize`, and
each rendered object checked against the Kubernetes API schema with no network.

Built-in kinds are validated by the official client's models (`kubernetes.client`, pydantic: unknown fields,
missing required fields and wrong types are errors); that the group/version serves the kind is read from the
client's API classes (`AppsV1Api.create_namespaced_deployment`). The Prometheus Operator's kinds are not in the
client: CRD_MODELS describes the fields of theirs that Tessera uses, in the same strict style.
"""

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from pydantic import BaseModel, ConfigDict, Field, StrictStr

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
COMPONENTS = sorted(p.parent.name for p in (DEPLOY / "components").glob("*/kustomization.yaml"))


def kubectl() -> str:
    """kubectl (it renders kustomizations too); skipped where it is missing, failed under CI=true."""
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is required in CI")
        pytest.skip("kubectl is not installed (these tests must run in CI)")
    return path


@cache
def _render(directory: Path) -> tuple[dict, ...]:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def render(overlay: str, *components: str, tmp_path: Path | None = None) -> list[dict]:
    """The objects of deploy/overlays/<overlay>, with deploy/components/<component>s added (through a kustomization
    written in tmp_path, as an admin's own overlay would add them)."""
    if not components:
        return list(_render(DEPLOY / "overlays" / overlay))
    assert tmp_path is not None
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / overlay, tmp_path)],
                "components": [os.path.relpath(DEPLOY / "components" / c, tmp_path) for c in components],
            }
        )
    )
    return list(_render(tmp_path))


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


# --- the schema ----------------------------------------------------------------------------------------------------


def _snake(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


def builtin_model(api_version: str, kind: str):
    """The client's model class of a built-in kind, or None when the client has no API serving it there."""
    group, _, version = api_version.rpartition("/")
    api_name = "".join(part.capitalize() for part in group.removesuffix(".k8s.io").split(".")) or "Core"
    api = getattr(client, f"{api_name}{version.capitalize()}Api", None)
    snake = _snake(kind)
    if api is None or not (hasattr(api, f"create_namespaced_{snake}") or hasattr(api, f"create_{snake}")):
        return None
    return getattr(client, f"{version.capitalize()}{kind}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Metadata(_Strict):
    name: StrictStr
    namespace: StrictStr
    labels: dict[StrictStr, StrictStr] = {}
    annotations: dict[StrictStr, StrictStr] = {}


class _SecretKey(_Strict):
    name: StrictStr
    key: StrictStr
    optional: bool | None = None


class _Authorization(_Strict):
    type: StrictStr = "Bearer"
    credentials: _SecretKey


class _Endpoint(_Strict):
    port: StrictStr
    path: StrictStr = "/metrics"
    interval: StrictStr | None = None
    scheme: StrictStr | None = None
    authorization: _Authorization | None = None


class _NamespaceSelector(_Strict):
    match_names: list[StrictStr] = Field(default=[], alias="matchNames")
    any: bool | None = None


class _ServiceMonitorSpec(_Strict):
    selector: client.V1LabelSelector
    namespace_selector: _NamespaceSelector | None = Field(default=None, alias="namespaceSelector")
    endpoints: list[_Endpoint] = Field(min_length=1)


class _Rule(_Strict):
    alert: StrictStr | None = None
    record: StrictStr | None = None
    expr: StrictStr
    for_: StrictStr | None = Field(default=None, alias="for")
    labels: dict[StrictStr, StrictStr] = {}
    annotations: dict[StrictStr, StrictStr] = {}


class _RuleGroup(_Strict):
    name: StrictStr
    interval: StrictStr | None = None
    rules: list[_Rule] = Field(min_length=1)


class _PrometheusRuleSpec(_Strict):
    groups: list[_RuleGroup] = Field(min_length=1)


def _crd(spec_model):
    class Resource(_Strict):
        api_version: StrictStr = Field(alias="apiVersion")
        kind: StrictStr
        metadata: _Metadata
        spec: spec_model

    return Resource


# The Prometheus Operator's CRDs (monitoring.coreos.com/v1), as far as Tessera's objects use them.
CRD_MODELS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _crd(_ServiceMonitorSpec),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _crd(_PrometheusRuleSpec),
}


def validate(obj: dict) -> None:
    """Raise (pydantic's ValidationError, or AssertionError for an unknown kind) unless `obj` fits its schema."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    model = builtin_model(*key) or CRD_MODELS.get(key)
    assert model is not None, f"no schema for {key}: not a kind the Kubernetes API serves at that version"
    model.model_validate(obj)
