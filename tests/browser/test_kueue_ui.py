"""End to end in Chromium, as an admin, against the simulator's Kueue: bind a pool's quota to a ClusterQueue from
the pool page, see the quota the sync writes, see the drift when someone edits the ClusterQueue behind Tessera's back
(value by value: live against what Tessera wrote), take the queue over, and see the sync write Tessera's quota again.
The sync (worker.kueue.kueue_sync, the task the reconcile tick enqueues) is run in-process at each step. These pages
read a live cluster, so axe-core checks them here (WCAG A/AA, docs/accessibility.md), with the cluster import page."""

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from core.models import AuditEvent
from fleet.models import Node, NodePool
from scheduling.models import KueueBinding
from tests.browser.axe import axe_violations
from tests.browser.test_workflows_ui import sign_in
from tests.factories import UserFactory
from worker.drivers import driver_for
from worker.inventory.cluster import sync_cluster_full
from worker.kueue import kueue_sync

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]
GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
POOL_NODES = ("gpu-node-0002", "gpu-node-0005")  # two H100 nodes of 8 whole GPUs
FLAVOR = "tessera-h100-nvidia-h100-80gb-hbm3"


def _edit_quota(custom, value: str) -> None:
    """Someone edits the ClusterQueue with kubectl: Tessera's flavor gets another nominalQuota."""
    cq = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "gpu")
    (flavor,) = [f for f in cq["spec"]["resourceGroups"][0]["flavors"] if f["name"] == FLAVOR]
    flavor["resources"][0]["nominalQuota"] = value
    custom.replace_cluster_custom_object(GROUP, VERSION, "clusterqueues", "gpu", cq)


def _quota(custom) -> str:
    cq = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", "gpu")
    (flavor,) = [f for f in cq["spec"]["resourceGroups"][0]["flavors"] if f["name"] == FLAVOR]
    return flavor["resources"][0]["nominalQuota"]


def test_bind_a_pool_to_kueue_see_quota_and_drift_then_take_over(page, live_server, sim, sim_cluster, custom):
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    UserFactory(username="ui-admin", role="admin")
    driver_for(sim_cluster).adopt_operator_configs()
    sync_cluster_full(sim_cluster)
    pool = NodePool.objects.create(cluster=sim_cluster, name="h100")
    Node.objects.filter(name__in=POOL_NODES).update(pool=pool)
    cq = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterQueue", "metadata": {"name": "gpu"}, "spec": {}}
    custom.create_cluster_custom_object(GROUP, VERSION, "clusterqueues", cq)

    sign_in(page, live_server, "ui-admin", pool.get_absolute_url())
    card = page.locator("#pool-kueue")
    expect(card).to_contain_text("Not bound: Tessera writes no Kueue quota for this pool.")
    card.get_by_role("link", name="Set up Kueue quota").click()
    expect(page.get_by_role("heading", name="Kueue quota of h100", level=1)).to_be_visible()
    page.get_by_label("ClusterQueues").fill("gpu, Not_Valid")
    page.get_by_role("button", name="Create binding").click()
    expect(page.locator("#err-cluster_queues")).to_have_text("Not a ClusterQueue name: 'Not_Valid'.")
    assert not axe_violations(page, "the Kueue form refused")
    assert not KueueBinding.objects.exists()
    page.get_by_label("ClusterQueues").fill("gpu")
    page.get_by_label("Lead time (minutes)").fill("30")
    page.get_by_role("button", name="Create binding").click()
    expect(page).to_have_url(live_server.url + pool.get_absolute_url() + "#pool-kueue")
    expect(card.locator("#kueue-enabled")).to_have_text("Enabled")
    expect(card.locator("#kueue-queues")).to_have_text("gpu")
    quota = card.locator("#kueue-quota tbody tr")
    expect(quota).to_have_count(1)
    expect(quota.first).to_contain_text(FLAVOR)
    expect(quota.first.locator("td").nth(2)).to_have_text("16")  # what the layout gives: 2 nodes × 8 GPUs
    expect(quota.first.locator("td").nth(3)).to_have_text("—")  # nothing written yet

    # The reconcile tick's sync writes the flavor's quota; the page shows what it wrote.
    assert kueue_sync(pool.pk) == {"gpu": "written"}
    assert _quota(custom) == "16"
    page.reload()
    expect(quota.first.locator("td").nth(3)).to_have_text("16")
    expect(card.locator("#kueue-error")).to_have_text("none")
    assert not axe_violations(page, "the pool page with its Kueue quota")
    page.screenshot(path="/tmp/tessera-pool-kueue.png", full_page=True)

    # Someone edits the ClusterQueue: the sync leaves it alone and reports it, value by value.
    _edit_quota(custom, "50")
    assert kueue_sync(pool.pk) == {"gpu": "drift"}
    page.reload()
    drift = card.get_by_role("alert").filter(has_text="ClusterQueue gpu changed outside Tessera")
    expect(drift).to_be_visible()
    row = drift.locator("tbody tr")
    expect(row.locator("td").nth(0)).to_have_text(FLAVOR)
    expect(row.locator("td").nth(1)).to_have_text("nvidia.com/gpu")
    expect(row.locator("td").nth(2)).to_have_text("50")  # live
    expect(row.locator("td").nth(3)).to_have_text("16")  # what Tessera wrote
    page.screenshot(path="/tmp/tessera-pool-kueue-drift.png", full_page=True)
    assert not axe_violations(page, "the pool page with a Kueue drift")
    assert _quota(custom) == "50"  # not overwritten

    drift.get_by_role("button", name="Take over gpu").click()
    expect(page.get_by_text("ClusterQueue gpu is Tessera's again: the next sync writes its quota.")).to_be_visible()
    expect(card.get_by_role("alert")).to_have_count(0)
    assert AuditEvent.objects.get(action="kueue.take_over").actor_label == "ui-admin"
    assert kueue_sync(pool.pk) == {"gpu": "written"}
    assert _quota(custom) == "16"
    page.reload()
    expect(quota.first.locator("td").nth(3)).to_have_text("16")

    # The cluster import page previews the NVIDIA configs the live cluster holds.
    page.goto(f"{live_server.url}/clusters/{sim_cluster.pk}/import/")
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    assert not axe_violations(page, "the cluster import page")
