"""A node belongs to one pool: a selector that would share nodes with another pool of its cluster is refused, in
the API (400, the other pool and the shared nodes named under node_selector) and in the services every door uses;
the rule is exact on the labels (fleet.labels.common_labels)."""

import pytest

from core.audit import Actor
from core.exceptions import ApplicationError
from core.models import AuditEvent
from fleet import services
from fleet.labels import common_labels, labels_text, parse_selector
from fleet.models import Node
from tests.factories import ClusterFactory, NodeFactory, NodePoolFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        ("tessera.io/pool=inference", "tessera.io/pool=training", None),
        ("tessera.io/pool=inference", "tessera.io/pool in (inference, batch)", {"tessera.io/pool": "inference"}),
        ("gpu=a100", "zone=east", {"gpu": "a100", "zone": "east"}),
        ("gpu=a100", "!gpu", None),
        ("gpu", "gpu!=a100", {"gpu": None}),
        ("gpu in (a100)", "gpu notin (a100, h100)", None),
        ("gpu in (a100, h100)", "gpu notin (a100)", {"gpu": "h100"}),
        ("gpu!=a100", "gpu!=h100", {}),  # a node without the label matches both
        ("", "gpu=a100", None),  # an empty selector selects nothing
    ],
)
def test_two_selectors_share_a_node_exactly_when_no_key_excludes_them(a, b, shared):
    assert common_labels(parse_selector(a), parse_selector(b)) == shared
    assert common_labels(parse_selector(b), parse_selector(a)) == shared


def test_a_witness_reads_as_labels():
    assert labels_text({"zone": "east", "gpu": None}) == "gpu, zone=east"


@pytest.fixture
def fleet():
    cluster = ClusterFactory(name="prod")
    inference = NodePoolFactory(cluster=cluster, name="inference", node_selector="tessera.io/pool=inference")
    for i in range(3):
        NodeFactory(cluster=cluster, pool=inference, name=f"inf-{i}", labels={"tessera.io/pool": "inference"})
    NodeFactory(cluster=cluster, name="spare", labels={"tessera.io/pool": "spare"})
    return cluster, inference


def test_an_overlap_names_the_pool_and_the_nodes_both_would_select(fleet):
    cluster, inference = fleet
    (overlap,) = services.pool_overlaps(cluster=cluster, node_selector="tessera.io/pool in (inference, spare)")
    assert overlap.pool == inference and overlap.nodes == ("inf-0", "inf-1", "inf-2")
    assert overlap.message == "Overlaps pool inference: both would select 3 nodes: inf-0, inf-1, inf-2."
    assert services.pool_overlaps(cluster=cluster, node_selector="tessera.io/pool=spare") == []
    # Another cluster's pools are not contenders; the pool itself is left out when it is edited.
    assert services.pool_overlaps(cluster=ClusterFactory(), node_selector="tessera.io/pool=inference") == []
    assert services.pool_overlaps(cluster=cluster, node_selector="tessera.io", exclude=inference) == []


def test_selectors_that_could_share_a_node_overlap_before_any_node_does(fleet):
    cluster, inference = fleet
    (overlap,) = services.pool_overlaps(cluster=cluster, node_selector="nvidia.com/gpu.product=H100")
    assert overlap.pool == inference and overlap.nodes == ()
    assert "a node labelled nvidia.com/gpu.product=H100, tessera.io/pool=inference would be" in overlap.message


def test_a_selector_overlaps_an_explicit_pool_only_through_its_members(fleet):
    cluster, _ = fleet
    explicit = NodePoolFactory(cluster=cluster, name="manual")
    Node.objects.filter(name="spare").update(pool=explicit)
    (overlap,) = services.pool_overlaps(cluster=cluster, node_selector="tessera.io/pool=spare")
    assert (overlap.pool, overlap.nodes) == (explicit, ("spare",))


def test_the_api_refuses_an_overlapping_selector_with_the_pool_and_nodes_named(admin_api, fleet):
    cluster, inference = fleet
    body = {"cluster": cluster.pk, "name": "everything", "node_selector": "tessera.io/pool"}
    response = admin_api.post("/api/v1/node-pools/", body, format="json")
    assert response.status_code == 400
    message = "Overlaps pool inference: both would select 3 nodes: inf-0, inf-1, inf-2."
    assert response.json() == {"message": message, "errors": {"node_selector": [message]}}
    assert not AuditEvent.objects.filter(action="pool.create").exists()

    spare = admin_api.post(
        "/api/v1/node-pools/", {**body, "name": "spare", "node_selector": "tessera.io/pool=spare"}, format="json"
    )
    assert spare.status_code == 201, spare.json()
    widened = admin_api.patch(
        f"/api/v1/node-pools/{spare.json()['id']}/", {"node_selector": "tessera.io/pool notin (x)"}, format="json"
    )
    assert widened.status_code == 400
    assert widened.json()["errors"]["node_selector"][0].startswith("Overlaps pool inference: both would select 3")
    # Changing anything but the selector is not judged again.
    renamed = admin_api.patch(f"/api/v1/node-pools/{spare.json()['id']}/", {"name": "spare-2"}, format="json")
    assert renamed.status_code == 200
    assert [e.action for e in AuditEvent.objects.filter(action__startswith="pool.").order_by("pk")] == [
        "pool.create",
        "pool.update",
    ]


def test_the_service_refuses_what_the_api_does(admin_user, fleet):
    cluster, _ = fleet
    with pytest.raises(ApplicationError) as refused:
        services.pool_create(
            actor=Actor.for_user(admin_user), cluster=cluster, name="x", node_selector="tessera.io/pool=inference"
        )
    assert refused.value.errors["node_selector"][0].startswith("Overlaps pool inference")


def test_a_node_two_older_pools_both_select_stays_with_the_older_when_a_selector_is_applied(fleet):
    """Pools saved before overlaps were refused may still overlap: applying either selector keeps the node where
    inventory puts it (the oldest pool), instead of passing it back and forth."""
    cluster, inference = fleet
    newer = NodePoolFactory(cluster=cluster, name="newer", node_selector="tessera.io/pool")
    services.pool_apply_selector(pool=newer)
    assert sorted(Node.objects.filter(pool=newer).values_list("name", flat=True)) == ["spare"]
    assert Node.objects.filter(pool=inference).count() == 3
