"""Cluster and pool changes and pool membership are audited like every other desired-state change, whichever door
they come in by: the API, the Django admin, or a pool's selector (issue 15, point 6)."""

import pytest
from django.urls import reverse

from core.models import AuditEvent
from fleet.models import Cluster, NodePool
from tests.factories import ClusterFactory, NodeFactory, NodePoolFactory, UserFactory

pytestmark = pytest.mark.django_db


def events(prefix: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action__startswith=prefix).order_by("pk"))


def test_cluster_create_update_delete_through_the_api_are_audited(admin_api):
    created = admin_api.post("/api/v1/clusters/", {"name": "east", "driver": "agent"}, format="json")
    assert created.status_code == 201
    url = f"/api/v1/clusters/{created.json()['id']}/"
    assert admin_api.patch(url, {"description": "rack 7"}, format="json").status_code == 200
    assert admin_api.patch(url, {"description": "rack 7"}, format="json").status_code == 200  # no change, no event
    assert admin_api.delete(url).status_code == 204
    create, update, delete = events("cluster.")
    assert (create.action, create.actor_label, create.object_repr) == ("cluster.create", "admin", "east")
    assert create.after["driver"] == "agent"
    assert (update.before["description"], update.after["description"]) == ("", "rack 7")
    assert delete.action == "cluster.delete" and delete.before["name"] == "east"


def test_the_kubeconfig_path_is_not_written_into_the_audit_log(admin_api, settings, tmp_path):
    settings.TESSERA = {**settings.TESSERA, "KUBECONFIG_DIR": str(tmp_path)}
    (tmp_path / "east.yaml").write_text("apiVersion: v1\nkind: Config\n")
    body = {"name": "east", "driver": "kubernetes", "kubeconfig_path": str(tmp_path / "east.yaml")}
    assert admin_api.post("/api/v1/clusters/", body, format="json").status_code == 201
    (event,) = events("cluster.")
    assert "east.yaml" not in str(event.after) and event.after["kubeconfig_path"].startswith("set, sha256 ")


def test_pool_create_update_delete_and_members_through_the_api_are_audited(admin_api):
    cluster = ClusterFactory(name="east")
    a, b = NodeFactory(cluster=cluster, name="a"), NodeFactory(cluster=cluster, name="b")
    body = {"cluster": cluster.pk, "name": "infer", "node_selector": ""}
    pool_id = admin_api.post("/api/v1/node-pools/", body, format="json").json()["id"]
    url = f"/api/v1/node-pools/{pool_id}/"
    assert admin_api.post(url + "members/", {"nodes": [a.pk, b.pk]}, format="json").status_code == 200
    assert admin_api.post(url + "members/", {"nodes": [b.pk]}, format="json").status_code == 200
    assert admin_api.patch(url, {"name": "serve"}, format="json").status_code == 200
    assert admin_api.delete(url).status_code == 204
    actions = [e.action for e in events("pool.")]
    assert actions == ["pool.create", "pool.set_members", "pool.set_members", "pool.update", "pool.delete"]
    _, first, second, update, delete = events("pool.")
    assert first.after == {"members": 2, "joined": ["a", "b"], "left": []}
    assert (second.before, second.after) == ({"members": 2}, {"members": 1, "joined": [], "left": ["a"]})
    assert (update.before["name"], update.after["name"]) == ("infer", "serve")
    assert delete.before["members"] == 1 and all(e.actor_label == "admin" for e in events("pool."))


def test_membership_a_selector_changes_is_audited_as_the_selector(admin_api, django_capture_on_commit_callbacks):
    cluster = ClusterFactory()
    NodeFactory(cluster=cluster, name="gpu-1", labels={"role": "infer"})
    NodeFactory(cluster=cluster, name="gpu-2", labels={"role": "train"})
    body = {"cluster": cluster.pk, "name": "infer", "node_selector": "role=infer"}
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_api.post("/api/v1/node-pools/", body, format="json").status_code == 201
    (joined,) = events("pool.members")
    assert joined.actor_kind == "system" and joined.after == {"members": 1, "joined": ["gpu-1"], "left": []}


def test_the_django_admin_goes_through_the_audited_services(client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    add = {"name": "lab", "driver": "agent", "operator_namespace": "gpu-operator", "metrics_url": ""}
    assert client.post(reverse("admin:fleet_cluster_add"), add).status_code == 302
    cluster = Cluster.objects.get(name="lab")
    change = reverse("admin:fleet_cluster_change", args=[cluster.pk])
    assert client.post(change, {**add, "description": "by hand"}).status_code == 302
    pool_add = {"cluster": cluster.pk, "name": "p", "node_selector": ""}
    assert client.post(reverse("admin:fleet_nodepool_add"), pool_add).status_code == 302
    pool = NodePool.objects.get(name="p")
    assert client.post(reverse("admin:fleet_nodepool_delete", args=[pool.pk]), {"post": "yes"}).status_code == 302
    assert client.post(reverse("admin:fleet_cluster_delete", args=[cluster.pk]), {"post": "yes"}).status_code == 302
    actions = [e.action for e in AuditEvent.objects.order_by("pk")]
    assert actions == ["cluster.create", "cluster.update", "pool.create", "pool.delete", "cluster.delete"]
    assert {e.actor_label for e in AuditEvent.objects.all()} == {"root"}


def test_pool_membership_is_not_edited_node_by_node_in_the_django_admin(client):
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    node = NodeFactory(pool=NodePoolFactory())
    html = client.get(reverse("admin:fleet_node_change", args=[node.pk])).content.decode()
    assert 'name="pool"' not in html
