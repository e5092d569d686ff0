"""Admission enforcement in the API and on the pages: `/api/v1/admission-policies/` (read-only, viewer role, filters,
bounded queries), the QoS policy page and the pool's compliance page (Applied / Error / Pending / Not applicable,
object names, the manifest in a <details> block, the hint when enforcement is off)."""

import re

import pytest
from django.urls import reverse

from core.audit import Actor
from sharing import services as sharing_services
from simulator import Simulator
from tests.factories import ClusterFactory, NodePoolFactory
from worker import admission
from worker.models import AdmissionPolicyState

pytestmark = pytest.mark.django_db

NAME = "tessera-inference-qos-inference"
URL = "/api/v1/admission-policies/"


@pytest.fixture
def sim():
    with Simulator(nodes=2, seed=7, apply_delay=0.0, workload_pods=0) as simulator:
        yield simulator


@pytest.fixture
def policy():
    return sharing_services.qos_policy_create(
        actor=Actor.system("test"), name="inference-qos", required_qos="guaranteed", enforce_admission=True
    )


def attach(pool, policy):
    sharing_services.pool_set_qos_policy(actor=Actor.system("test"), pool=pool, policy=policy)
    return pool


@pytest.fixture
def applied(sim, policy):
    """A Kubernetes pool whose pair is applied in the simulator, and an agent pool (not applicable)."""
    cluster = ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path)
    pool = attach(NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference"), policy)
    agent = ClusterFactory(name="bare-metal", driver="agent", kubeconfig_path="")
    slurm = attach(NodePoolFactory(cluster=agent, name="slurm", node_selector="tessera.io/pool=slurm"), policy)
    admission.admission_sync(cluster=cluster)
    admission.admission_sync(cluster=agent)
    return pool, slurm


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_viewers_list_and_filter_the_recorded_state(applied, viewer_api, django_assert_max_num_queries):
    pool, slurm = applied
    with django_assert_max_num_queries(4):
        listed = viewer_api.get(URL).json()
    assert listed["count"] == 2
    by_pool = {row["pool_name"]: row for row in listed["results"]}
    row = by_pool["inference"]
    assert (row["state"], row["object_name"], row["policy_name"], row["error"]) == (
        "applied",
        NAME,
        "inference-qos",
        "",
    )
    assert row["cluster"]["name"] == "sim" and row["pool"]["id"] == pool.pk and row["qos_policy"]["name"]
    assert set(row["resource_versions"]) == {"policy", "binding"} and len(row["manifest_hash"]) == 64
    assert "manifest" not in row and by_pool["slurm"]["state"] == "not_applicable"

    detail = viewer_api.get(f"{URL}{row['id']}/").json()
    assert "kind: ValidatingAdmissionPolicy" in detail["manifest"] and "kubeconfig" not in detail["manifest"]
    assert [r["pool_name"] for r in viewer_api.get(f"{URL}?pool={slurm.pk}").json()["results"]] == ["slurm"]
    assert viewer_api.get(f"{URL}?cluster={pool.cluster_id}&state=applied").json()["count"] == 1
    assert viewer_api.get(f"{URL}?state=error").json()["count"] == 0
    assert viewer_api.get(f"{URL}?search={NAME}").json()["count"] == 1


def test_the_endpoint_is_read_only_and_needs_a_role(applied, api_client, admin_api, db):
    assert api_client.get(URL).status_code == 401
    row_id = AdmissionPolicyState.objects.first().pk
    assert admin_api.post(URL, {}, format="json").status_code == 405
    assert admin_api.delete(f"{URL}{row_id}/").status_code == 405
    assert admin_api.patch(f"{URL}{row_id}/", {"state": "error"}, format="json").status_code == 405

    from rest_framework.test import APIClient

    from tests.factories import UserFactory

    nobody = APIClient()
    nobody.force_authenticate(UserFactory(username="no-role"))
    assert nobody.get(URL).status_code == 403


def test_the_policy_page_shows_each_pools_admission_state(applied, client, viewer, policy):
    pool, _ = applied
    client.force_login(viewer)
    html = client.get(reverse("sharing:qos_detail", args=[policy.pk])).content.decode()
    page = text(html)
    assert "Admission enforcement" in page
    assert "sim / inference Applied" in page and NAME in page
    assert "bare-metal / slurm Not applicable" in page and "no Kubernetes API server" in page
    manifest = re.search(
        r"<details class=\"disclosure\"><summary>Manifest \(YAML\)</summary><pre[^>]*>(.*?)</pre>", html, re.S
    )
    assert manifest and "kind: ValidatingAdmissionPolicyBinding" in manifest.group(1)
    assert "Not enforced at admission" not in page

    # The policy changes: the row is behind until the next sync, and the page says so.
    sharing_services.qos_policy_update(actor=Actor.system("test"), policy=policy, required_priority_class="high")
    assert "sim / inference Pending" in text(
        client.get(reverse("sharing:qos_detail", args=[policy.pk])).content.decode()
    )


def test_errors_are_shown_on_the_compliance_page_never_a_500(sim, client, viewer, policy):
    cluster = ClusterFactory(name="old", kubeconfig_path=sim.kubeconfig_path)
    pool = attach(NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference"), policy)
    sim.faults.update({"unserved": ["validatingadmissionpolicies.admissionregistration.k8s.io"]})
    admission.admission_sync(cluster=cluster)
    client.force_login(viewer)
    response = client.get(reverse("sharing:pool_compliance", args=[pool.pk]))
    assert response.status_code == 200
    page = text(response.content.decode())
    assert "Kubernetes 1.30 or later State Error since now" in page
    assert "does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies" in page
    assert "Kubernetes 1.30 or later" in page and NAME in page


def test_without_enforcement_the_pages_give_a_one_line_hint(client, admin_user):
    relaxed = sharing_services.qos_policy_create(actor=Actor.system("test"), name="relaxed", required_qos="burstable")
    pool = attach(NodePoolFactory(name="batch", node_selector="tessera.io/pool=batch"), relaxed)
    client.force_login(admin_user)
    page = text(client.get(reverse("sharing:qos_detail", args=[relaxed.pk])).content.decode())
    assert "Not enforced at admission: only the compliance report checks running pods. Edit the policy" in page
    compliance = text(client.get(reverse("sharing:pool_compliance", args=[pool.pk])).content.decode())
    assert "Not enforced at admission: relaxed is checked against running pods only" in compliance
    assert "Applied" not in compliance and "Pending" not in compliance


def test_an_enforcing_policy_not_yet_synced_is_pending(client, viewer, policy):
    pool = attach(NodePoolFactory(name="fresh", node_selector="tessera.io/pool=fresh"), policy)
    client.force_login(viewer)
    page = text(client.get(reverse("sharing:pool_compliance", args=[pool.pk])).content.decode())
    assert "State Pending applied by the next sync" in page and "tessera-inference-qos-fresh" in page
