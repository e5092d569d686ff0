"""The pool pages without a browser: the editor (admins) with its live members preview and its no-JavaScript
fallback, an overlap shown on the form, edit and delete audited, and the pool page saying what runs now and why."""

import pytest
from django.urls import reverse

from core.models import AuditEvent
from fleet.models import Node, NodePool
from sharing.models import PoolSharing
from tests.factories import ClusterFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster():
    cluster = ClusterFactory(name="prod")
    inference = NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference")
    NodeFactory(cluster=cluster, pool=inference, name="inf-0", labels={"tessera.io/pool": "inference"})
    for i in range(2):
        NodeFactory(cluster=cluster, name=f"train-{i}", labels={"tessera.io/pool": "training"})
    return cluster


def _body(cluster, **values):
    return {"name": "training", "cluster": cluster.pk, "description": "", "node_selector": "", "members": "",
            "profile": "", "qos_policy": "", "schedule": "keep", **values}  # fmt: skip


def test_only_admins_edit_pools(client, operator, cluster):
    client.force_login(operator)
    assert client.get(reverse("console:pool_create")).status_code == 403
    assert client.post(reverse("console:pool_members"), _body(cluster)).status_code == 403


def test_the_live_preview_lists_the_members_and_the_overlaps(client, admin_user, cluster):
    client.force_login(admin_user)
    url = reverse("console:pool_members")
    html = client.post(url, _body(cluster, node_selector="tessera.io/pool=training"), HTTP_HX_REQUEST="true")
    text = html.content.decode()
    assert html.status_code == 200 and 'id="pool-members"' in text and "<html" not in text
    assert "2 nodes</strong> of prod match" in text and "train-0" in text and "Would be refused" not in text
    text = client.post(url, _body(cluster, node_selector="tessera.io/pool"), HTTP_HX_REQUEST="true").content.decode()
    assert "3 nodes</strong>" in text and "Overlaps pool inference: both would select 1 node: inf-0." in text
    text = client.post(url, _body(cluster, node_selector="a in (b"), HTTP_HX_REQUEST="true").content.decode()
    assert "is not a valid label selector term" in text


def test_create_refused_on_overlap_then_created_edited_and_deleted(client, admin_user, cluster):
    client.force_login(admin_user)
    refused = client.post(reverse("console:pool_create"), _body(cluster, node_selector="tessera.io/pool"))
    assert refused.status_code == 400 and not NodePool.objects.filter(name="training").exists()
    assert "Overlaps pool inference: both would select 1 node: inf-0." in refused.content.decode()

    # Without JavaScript, "Show matching nodes" renders the same preview and saves nothing.
    check = client.post(reverse("console:pool_create"), _body(cluster, node_selector="x=y", action="check"))
    assert check.status_code == 200 and "0 nodes</strong>" in check.content.decode()

    created = client.post(reverse("console:pool_create"), _body(cluster, node_selector="tessera.io/pool=training"))
    pool = NodePool.objects.get(name="training")
    assert created.status_code == 302 and created["Location"] == pool.get_absolute_url()
    assert sorted(pool.nodes.values_list("name", flat=True)) == ["train-0", "train-1"]  # applied at once

    edit = client.post(reverse("console:pool_update", args=[pool.pk]), _body(cluster, members="train-1"))
    assert edit.status_code == 302
    assert list(pool.nodes.values_list("name", flat=True)) == ["train-1"]

    page = client.get(pool.get_absolute_url()).content.decode()
    assert "the pool has no default profile and no schedule" in page and "Edit pool" in page

    assert client.post(reverse("console:pool_delete", args=[pool.pk])).status_code == 302
    assert not NodePool.objects.filter(pk=pool.pk).exists() and Node.objects.get(name="train-1").pool is None
    actions = list(AuditEvent.objects.filter(object_type="nodepool").order_by("pk").values_list("action", flat=True))
    assert actions == ["pool.create", "pool.members", "pool.update", "pool.set_members", "pool.delete"]
    assert not PoolSharing.objects.exists()


def test_members_must_be_nodes_of_the_cluster_and_not_beside_a_selector(client, admin_user, cluster):
    client.force_login(admin_user)
    unknown = client.post(reverse("console:pool_create"), _body(cluster, members="train-0, nope"))
    assert unknown.status_code == 400 and "No live node of prod named nope." in unknown.content.decode()
    both = client.post(reverse("console:pool_create"), _body(cluster, members="train-0", node_selector="a=b"))
    assert both.status_code == 400 and "not both" in both.content.decode()
