"""`manage.py adopt_operator_configs` (docs/install.md step 6) points a simulated cluster's ClusterPolicy at
Tessera's ConfigMaps, seeded with what the nodes use, audits it, and is harmless to run again."""

import pytest
from django.core.management import CommandError, call_command
from kubernetes import client

from core.models import AuditEvent
from worker.drivers.kubernetes.operator import SUGGESTED_MIG_CONFIGMAP, SUGGESTED_PLUGIN_CONFIGMAP

pytestmark = pytest.mark.django_db


def _policy_spec(core) -> dict:
    policy = client.CustomObjectsApi(core.api_client).get_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
    )
    return policy["spec"]


def test_points_the_cluster_policy_at_tesseras_configmaps_once(sim_cluster, core, capsys):
    assert _policy_spec(core)["migManager"]["config"]["name"] != SUGGESTED_MIG_CONFIGMAP
    call_command("adopt_operator_configs", "sim")
    out = capsys.readouterr().out
    assert f"now points at {SUGGESTED_MIG_CONFIGMAP} and {SUGGESTED_PLUGIN_CONFIGMAP}" in out
    spec = _policy_spec(core)
    assert spec["migManager"]["config"]["name"] == SUGGESTED_MIG_CONFIGMAP
    assert spec["devicePlugin"]["config"]["name"] == SUGGESTED_PLUGIN_CONFIGMAP
    seeded = core.read_namespaced_config_map(SUGGESTED_MIG_CONFIGMAP, "gpu-operator").data["config.yaml"]
    selected = {n.metadata.labels.get("nvidia.com/mig.config") for n in core.list_node().items} - {None}
    assert selected and all(f"{name}:" in seeded for name in selected)  # every config a node selects today
    event = AuditEvent.objects.get(action="cluster.adopt_configs")
    assert (event.object_repr, event.actor_label) == ("sim", "manage.py adopt_operator_configs")
    call_command("adopt_operator_configs", "sim")
    assert "already points at Tessera's ConfigMaps" in capsys.readouterr().out


def test_unknown_cluster_is_refused(db):
    with pytest.raises(CommandError, match="no Kubernetes cluster named 'nope'"):
        call_command("adopt_operator_configs", "nope")
