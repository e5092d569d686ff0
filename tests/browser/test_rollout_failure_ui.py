"""End to end in Chromium (issue 17): a canary fails, its rollout shows failed at once with every node waiting for a
retry, and the node page shows the next try and lets an operator retry now."""

import re

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from core.audit import Actor
from fleet import services as fleet_services
from fleet.models import Node
from sharing import services as sharing_services
from tests.browser.test_workflows_ui import sign_in
from tests.factories import ClusterFactory, NodePoolFactory, UserFactory
from tests.worker.test_engine import H100, _observation, _report_applied
from worker import services
from worker.models import NodeChange, NodeRetry, Rollout

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]


@pytest.fixture
def failed_rollout(live_server):
    """An agent pool of four nodes whose rollout's canary failed (MIG Manager reported failed) and was rolled back."""
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    UserFactory(username="ui-operator", role="operator")
    cluster = ClusterFactory(name="lab", driver="agent", kubeconfig_path="")
    pool = NodePoolFactory(cluster=cluster, name="training")
    names = [f"lab-h100-{i}" for i in range(4)]
    fleet_services.inventory_record(
        cluster=cluster, nodes=[_observation(n, mig_config="all-disabled", dp="whole") for n in names]
    )
    Node.objects.update(pool=pool)
    actor = Actor.system("test-admin")
    profile = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
    # The assignment's reconcile ran in-process on commit: the rollout exists and its canary has started.
    rollout = Rollout.objects.get()
    canary = rollout.changes.exclude(status="queued").select_related("node").get()
    services.node_changes_step([canary.pk])
    assert NodeChange.objects.get(pk=canary.pk).status == "verifying"
    canary.refresh_from_db()
    _report_applied(cluster, canary, state="failed")
    services.node_changes_step([canary.pk])
    services.rollout_advance(rollout.pk)
    canary.refresh_from_db()
    assert (canary.status, Rollout.objects.get().status) == ("rolled_back", "failed")
    # The agent reports the config it was rolled back to.
    fleet_services.inventory_record(cluster=cluster, nodes=[_observation(canary.node.name, mig_config="all-disabled",
                                                                          dp="whole")])  # fmt: skip
    Node.objects.filter(pk=canary.node_id).update(agent_config_id="")
    return canary


def test_failed_canary_fails_the_rollout_and_the_node_offers_retry_now(page, live_server, failed_rollout):
    canary = failed_rollout
    sign_in(page, live_server, "ui-operator", f"/rollouts/{canary.rollout_id}/")
    live = page.locator("#rollout-live")
    expect(live.locator(".card__header .badge").first).to_have_text("Failed")
    expect(live).to_contain_text("4 nodes wait for a retry · next try")
    expect(live.locator(f"#change-{canary.pk}")).to_contain_text("MIG Manager reported failed")
    expect(page.locator(".progress, [role=progressbar]").first).to_be_visible()
    page.screenshot(path="/tmp/tessera-rollout-failed-canary.png", full_page=True)

    page.get_by_role("link", name=canary.node.name, exact=True).first.click()
    expect(page).to_have_url(re.compile(rf"/nodes/{canary.node_id}/$"))
    retry = NodeRetry.objects.get(node=canary.node)
    callout = page.locator(".callout--drift")
    expect(callout).to_contain_text(f"Last change failed · next try {retry.next_retry_at:%H:%M}")
    page.screenshot(path="/tmp/tessera-node-next-try.png", full_page=True)
    callout.get_by_role("button", name="Retry now").click()
    expect(page.locator(".messages")).to_contain_text(f"{canary.node.name}: retrying now")
    expect(page.locator(".callout--drift")).not_to_contain_text("next try")
    # The loop took it at once (tasks run in-process here): a new change for this node only, under way.
    expect(page.locator(".callout--drift")).to_contain_text(re.compile(r"Rollout #\d+: (waiting|applying|verifying)"))
    assert NodeChange.objects.filter(node=canary.node).exclude(rollout_id=canary.rollout_id).count() == 1
