"""Admission enforcement in the API and on the pages: `/api/v1/admission-policies/` (read-only, viewer role, filters,
bounded queries), the QoS policy page and the pool's compliance page (Applied / Error / Pending / Not applicable,
object names, the manifest in a <details> block, the hint when enforcement is off); clusters whose admission objects
may still deny pods can neither switch driver nor be deleted; the rows are read-only in the Django admin."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.admin.sites import site
from django.test import RequestFactory
from django.urls import reverse

from core.audit import Actor
from core.models import AuditEvent
from fleet.models import Cluster
from sharing import services as sharing_services
from tests.factories import ClusterFactory, NodePoolFactory
from worker import admission
from worker.models import AdmissionPolicyState

pytestmark = pytest.mark.django_db

NAME = "tessera-inference-qos-inference"
URL = "/api/v1/admission-policies/"


@pytest.fixture
def sim_options():
    return {"nodes": 2}


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
    html = client.get(reverse("console:qos_detail", args=[policy.pk])).content.decode()
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
        client.get(reverse("console:qos_detail", args=[policy.pk])).content.decode()
    )


def test_errors_are_shown_on_the_compliance_page_never_a_500(sim, client, viewer, policy):
    cluster = ClusterFactory(name="old", kubeconfig_path=sim.kubeconfig_path)
    pool = attach(NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference"), policy)
    sim.faults.update({"unserved": ["validatingadmissionpolicies.admissionregistration.k8s.io"]})
    admission.admission_sync(cluster=cluster)
    client.force_login(viewer)
    # Read 5 s after the error, however long the sync and the sign-in took on a loaded box.
    with time_machine.travel(AdmissionPolicyState.objects.get().error_at + timedelta(seconds=5), tick=False):
        response = client.get(reverse("console:pool_compliance", args=[pool.pk]))
    assert response.status_code == 200
    page = text(response.content.decode())
    assert "Kubernetes 1.30 or later State Error since 5 seconds ago" in page
    assert "does not serve admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies" in page
    assert "Kubernetes 1.30 or later" in page and NAME in page


def test_without_enforcement_the_pages_give_a_one_line_hint(client, admin_user):
    relaxed = sharing_services.qos_policy_create(actor=Actor.system("test"), name="relaxed", required_qos="burstable")
    pool = attach(NodePoolFactory(name="batch", node_selector="tessera.io/pool=batch"), relaxed)
    client.force_login(admin_user)
    page = text(client.get(reverse("console:qos_detail", args=[relaxed.pk])).content.decode())
    assert "Not enforced at admission: only the compliance report checks running pods. Edit the policy" in page
    compliance = text(client.get(reverse("console:pool_compliance", args=[pool.pk])).content.decode())
    assert "Not enforced at admission: relaxed is checked against running pods only" in compliance
    assert "Applied" not in compliance and "Pending" not in compliance


def test_an_enforcing_policy_not_yet_synced_is_pending(client, viewer, policy):
    pool = attach(NodePoolFactory(name="fresh", node_selector="tessera.io/pool=fresh"), policy)
    client.force_login(viewer)
    page = text(client.get(reverse("console:pool_compliance", args=[pool.pk])).content.decode())
    assert "State Pending applied by the next sync" in page and "tessera-inference-qos-fresh" in page


def test_the_compliance_page_shows_the_suffixed_name_the_sync_applied(sim, client, viewer, policy):
    """Pools whose names collide get suffixes over the whole cluster; the page of one of them shows the same name."""
    cluster = ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path)
    first = attach(NodePoolFactory(cluster=cluster, name="a-b", node_selector="tessera.io/pool=a-b"), policy)
    attach(NodePoolFactory(cluster=cluster, name="a b", node_selector="tessera.io/pool=a_b"), policy)
    assert admission.admission_sync(cluster=cluster).created == 4
    suffixed = f"tessera-inference-qos-a-b--{first.pk}"
    (view,) = admission.pool_admission_views([first])
    assert (view.status, view.name) == ("applied", suffixed)
    client.force_login(viewer)
    page = text(client.get(reverse("console:pool_compliance", args=[first.pk])).content.decode())
    assert "State Applied" in page and suffixed in page and "Pending" not in page


def test_a_cluster_with_admission_objects_cannot_switch_driver_or_be_deleted(sim, admin_api, policy):
    cluster = ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path)
    attach(NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference"), policy)
    admission.admission_sync(cluster=cluster)
    url = f"/api/v1/clusters/{cluster.pk}/"

    switched = admin_api.patch(url, {"driver": "agent"}, format="json")
    assert switched.status_code == 409
    message = switched.json()["message"]
    assert f"Cluster sim still has admission policies in its API server that deny GPU pods ({NAME}" in message
    assert "Switch admission enforcement off" in message and "compliance pages show Removing" in message
    assert "then switch its driver." in message and "/api/v1/admission-policies/<id>/forget/" in message
    deleted = admin_api.delete(url)
    assert deleted.status_code == 409 and "then delete it." in deleted.json()["message"]
    assert Cluster.objects.get(pk=cluster.pk).driver == "kubernetes"

    # Enforcement off, but the API server refuses the deletes: the row is `removing` and still holds the cluster.
    sharing_services.qos_policy_update(actor=Actor.system("test"), policy=policy, enforce_admission=False)
    sim.faults.update({"write_error_rate": 1.0, "error_codes": [403]})
    admission.admission_sync(cluster=cluster)
    assert AdmissionPolicyState.objects.get().state == "removing"
    assert admin_api.delete(url).status_code == 409

    sim.faults.update({"write_error_rate": 0.0})
    admission.admission_sync(cluster=cluster)
    assert not AdmissionPolicyState.objects.exists()
    switched = admin_api.patch(url, {"driver": "agent"}, format="json")
    assert switched.status_code == 200 and switched.json()["driver"] == "agent"
    assert admin_api.delete(url).status_code == 204 and not Cluster.objects.filter(pk=cluster.pk).exists()


def test_an_admin_forgets_the_objects_of_a_cluster_gone_for_good(sim, admin_api, operator_api, policy):
    cluster = ClusterFactory(name="sim", kubeconfig_path=sim.kubeconfig_path)
    attach(NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference"), policy)
    admission.admission_sync(cluster=cluster)
    row = AdmissionPolicyState.objects.get()
    forget = f"/api/v1/admission-policies/{row.pk}/forget/"
    assert operator_api.post(forget).status_code == 403 and AdmissionPolicyState.objects.exists()
    assert admin_api.post(forget).status_code == 204 and not AdmissionPolicyState.objects.exists()
    event = AuditEvent.objects.get(action="admission.forget")
    assert (event.object_id, event.before["name"], event.before["state"]) == (
        str(cluster.pk),
        row.object_name,
        "applied",
    )
    assert admin_api.patch(f"/api/v1/clusters/{cluster.pk}/", {"driver": "agent"}, format="json").status_code == 200


def test_a_pool_that_never_got_objects_does_not_hold_its_cluster(admin_api, policy):
    explicit = attach(NodePoolFactory(name="hand-picked", node_selector=""), policy)  # cannot be enforced: an error
    admission.admission_sync(cluster=explicit.cluster)
    assert AdmissionPolicyState.objects.get().state == "error"
    assert admin_api.delete(f"/api/v1/clusters/{explicit.cluster_id}/").status_code == 204


def test_the_rows_are_read_only_in_the_django_admin(applied):
    from tests.factories import UserFactory

    request = RequestFactory().get("/admin/")
    request.user = UserFactory(username="root", is_staff=True, is_superuser=True)
    model_admin = site._registry[AdmissionPolicyState]
    row = AdmissionPolicyState.objects.first()
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, row)
    assert not model_admin.has_delete_permission(request, row)
    assert "delete_selected" not in model_admin.get_actions(request)


def test_the_django_admin_shows_the_refusal_instead_of_failing(client, applied):
    from django.forms.models import model_to_dict

    from tests.factories import UserFactory

    pool, _ = applied
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    data = {k: "" if v is None else v for k, v in model_to_dict(pool.cluster).items() if k != "in_cluster"}
    change = reverse("admin:fleet_cluster_change", args=[pool.cluster_id])
    response = client.post(change, {**data, "driver": "agent", "kubeconfig_path": ""}, follow=True)
    assert response.status_code == 200 and "still has admission policies in its API server" in response.content.decode()
    assert Cluster.objects.get(pk=pool.cluster_id).driver == "kubernetes"
    # Its rows cannot be deleted there, so neither can the cluster they belong to (Django's own refusal).
    assert (
        client.post(reverse("admin:fleet_cluster_delete", args=[pool.cluster_id]), {"post": "yes"}).status_code == 403
    )
