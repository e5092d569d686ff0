"""End to end in Chromium: a QoS policy checked live against a pool while it is written (a time-slicing pool refuses
memory isolation, a MIG pool accepts it), attached through its page, a pool's compliance checked on demand, and an
agent join token shown once."""

import re

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from core.audit import Actor
from fleet.models import AgentJoinToken
from sharing import services as sharing_services
from sharing.models import PoolSharing, QoSComplianceReport, QoSPolicy
from tests.factories import ClusterFactory, GpuFactory, NodeFactory, NodePoolFactory, PodFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

PASSWORD = "pw-for-tests-1"
H100 = "NVIDIA-H100-80GB-HBM3"
GUARANTEED = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "4", "memory": "16Gi"}}}]}
BURSTABLE = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
BEST_EFFORT = {"containers": [{"name": "c", "resources": {}}]}
SCREENSHOTS = {
    "editor_conflict": "/tmp/tessera-qos-editor-conflict.png",
    "editor": "/tmp/tessera-qos-editor.png",
    "policy": "/tmp/tessera-qos-policy.png",
    "compliance": "/tmp/tessera-qos-compliance.png",
    "compliance_list": "/tmp/tessera-qos-compliance-list.png",
    "tokens": "/tmp/tessera-agent-tokens.png",
    "node": "/tmp/tessera-node-qos.png",
    "list": "/tmp/tessera-qos-list.png",
    "overview": "/tmp/tessera-overview-qos.png",
}


@pytest.fixture
def fleet(live_server):
    """An admin; a time-slicing pool "batch" and a MIG pool "inference" of H100 nodes (an agent cluster), whose
    pods are mostly Guaranteed, one BestEffort."""
    for name in ("viewer", "operator", "admin"):
        Group.objects.get_or_create(name=name)
    UserFactory(username="ui-admin", role="admin")
    actor = Actor.system("test")
    cluster = ClusterFactory(name="prod-east", driver="agent", kubeconfig_path="", connection_state="ok")
    pools = {}
    for pool_name, mode in (("batch", "time_slicing"), ("inference", "mig")):
        pool = NodePoolFactory(cluster=cluster, name=pool_name)
        for i in range(2):
            node = NodeFactory(
                cluster=cluster,
                pool=pool,
                name=f"{pool_name[:3]}-h100-{i:02d}",
                kubelet_config={"topologyManagerPolicy": "single-numa-node", "cpuManagerPolicy": "static"},
                agent_version="0.9.1",
            )
            for index in range(2):
                GpuFactory(node=node, index=index, product=H100)
        extra = {"replicas": 4} if mode == "time_slicing" else {"mig_layouts": {"all": {"1g.10gb": 7}}}
        profile = sharing_services.profile_create(
            actor=actor, name=f"{pool_name}-{mode.replace('_', '-')}", mode=mode, target_products=[H100], **extra
        )
        sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
        pools[pool_name] = pool
    inference = pools["inference"].nodes.order_by("name")
    inference.filter(name="inf-h100-01").update(kubelet_config={"topologyManagerPolicy": "best-effort"})
    PodFactory(node=inference[0], namespace="ml", name="llama-serve-0", spec=GUARANTEED)
    PodFactory(node=inference[0], namespace="ml", name="llama-serve-1", spec=GUARANTEED)
    PodFactory(node=inference[1], namespace="ml", name="embedder-0", spec=GUARANTEED, priority_class="low")
    PodFactory(node=inference[1], namespace="research", name="notebook-ada", spec=BEST_EFFORT)
    PodFactory(node=inference[1], namespace="research", name="eval-job-3", spec=BURSTABLE)
    return pools


def shoot(page, name):
    """A full-page screenshot from the top (the editor's side panel is sticky)."""
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=SCREENSHOTS[name], full_page=True)


def sign_in(page, live_server, username, path="/"):
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(live_server.url + "/login/?next=" + path)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(live_server.url + path)


def test_write_a_policy_checked_live_attach_it_and_check_compliance(page, live_server, fleet):
    sign_in(page, live_server, "ui-admin", "/qos/new/")
    page.evaluate("window.tesseraMarker = 'same page'")
    expect(page.get_by_role("button", name="Check")).to_be_hidden()  # live checks make it redundant
    page.get_by_label("Name", exact=True).fill("inference-isolated")
    page.get_by_label("Pod QoS class").select_option("guaranteed")
    page.get_by_label("Require memory isolation (MIG or whole GPUs)").check()
    page.get_by_label("Persistence mode").select_option("on")
    page.get_by_label("Locked GPU clock, min").fill("1500")
    page.get_by_label("Locked GPU clock, max").fill("1200")
    page.get_by_label("Power limit").fill("600")
    page.get_by_label("Transparent huge pages").select_option("never")
    page.get_by_label("vm.swappiness").fill("10")
    page.get_by_label("Topology manager policy").select_option("single-numa-node")
    expect(page.locator("#err-gpu_clock_max_mhz")).to_have_text("The maximum clock must be at least the minimum.")

    page.get_by_label("Measure against pool").select_option(label="prod-east / batch")
    impact = page.locator("#qos-impact")
    expect(impact).to_contain_text("time-slicing gives no memory isolation; use MIG")
    expect(impact).to_contain_text("Attaching it to batch would be refused")
    assert page.evaluate("window.tesseraMarker") == "same page"
    shoot(page, "editor_conflict")

    # Fix it: the clock bounds, and measure against the MIG pool the policy is meant for.
    page.get_by_label("Locked GPU clock, max").fill("1980")
    expect(page.locator("#err-gpu_clock_max_mhz")).to_have_text("")
    page.get_by_label("Measure against pool").select_option(label="prod-east / inference")
    expect(impact).not_to_contain_text("no memory isolation")
    expect(impact).to_contain_text("These rules would flag 2 of 5 observed pods on pool inference")
    expect(impact.locator(".badge", has_text="Consistent")).to_be_visible()
    assert page.evaluate("window.tesseraMarker") == "same page"
    shoot(page, "editor")

    page.get_by_role("button", name="Create policy").click()
    expect(page.get_by_role("heading", name="inference-isolated", level=1)).to_be_visible()
    expect(page.locator(".messages")).to_contain_text("QoS policy inference-isolated saved.")
    policy = QoSPolicy.objects.get(name="inference-isolated")
    assert (policy.requires_memory_isolation, policy.gpu_clock_max_mhz, policy.power_limit_w) == (True, 1980, 600)

    attach = page.locator("#qos-attach")
    attach.get_by_label("Pool", exact=True).select_option(label="prod-east / batch")
    expect(attach).to_contain_text("time-slicing gives no memory isolation")
    expect(attach.get_by_role("button", name="Attach to batch")).to_be_disabled()
    attach.get_by_label("Pool", exact=True).select_option(label="prod-east / inference")
    expect(attach).to_contain_text("would flag 2 of 5")
    attach.get_by_role("button", name="Attach to inference").click()
    expect(page.locator(".messages")).to_contain_text("inference-isolated is now the QoS policy of pool inference")
    assert PoolSharing.objects.get(pool=fleet["inference"]).qos_policy == policy
    shoot(page, "policy")

    page.get_by_title("Compliance of inference").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("QoS compliance of inference")
    expect(page.get_by_role("heading", name="Not checked yet")).to_be_visible()
    page.get_by_role("button", name="Check now").click()
    expect(page.locator(".messages")).to_contain_text("Pool inference checked: 2 violations.")
    offenders = page.locator("section", has=page.get_by_role("heading", name="Offending pods"))
    expect(offenders).to_contain_text("research/notebook-ada")
    expect(offenders).to_contain_text("QoS class BestEffort; the pool requires Guaranteed")
    expect(offenders).to_contain_text("inf-h100-01")
    kubelets = page.locator("section", has=page.get_by_role("heading", name="Kubelet settings"))
    expect(kubelets).to_contain_text("topologyManagerPolicy")
    expect(kubelets).to_contain_text("best-effort")
    assert QoSComplianceReport.objects.get(pool=fleet["inference"]).violation_count == 2
    shoot(page, "compliance")

    page.get_by_role("link", name="QoS compliance", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("QoS compliance")
    shoot(page, "compliance_list")

    page.goto(live_server.url + fleet["inference"].nodes.order_by("name").first().get_absolute_url())
    expect(page.get_by_role("heading", name="QoS settings")).to_be_visible()
    shoot(page, "node")

    page.get_by_role("link", name="QoS", exact=True).click()
    expect(page.get_by_role("link", name="inference-isolated")).to_be_visible()
    shoot(page, "list")
    page.get_by_role("link", name="Overview", exact=True).click()
    attention = page.locator("section", has=page.get_by_role("heading", name="Needs attention"))
    expect(attention.get_by_role("link", name=re.compile("Policy violations"))).to_contain_text("2")
    shoot(page, "overview")


def test_join_token_is_shown_once_with_the_commands(page, live_server, fleet):
    sign_in(page, live_server, "ui-admin", "/agents/tokens/")
    form = page.locator("section", has=page.get_by_role("heading", name="New join token"))
    form.get_by_label("Cluster").select_option(label="prod-east")
    form.get_by_label("Name", exact=True).fill("rack-b12 DaemonSet")
    form.get_by_label("Expires after").fill("48")
    form.get_by_label("Registrations, at most").fill("40")
    form.get_by_role("button", name="Create token").click()
    created = page.locator(".once-card")
    expect(created).to_contain_text("it is shown this once")
    token = page.get_by_role("textbox", name="Join token").input_value()
    assert token.startswith("tsj_")
    expect(created.locator("#cmd-agent")).to_have_text(
        f"python -m agent --server {live_server.url} --join-token {token}"
    )
    expect(created.locator("#cmd-secret")).to_contain_text(f"--from-literal=join-token={token}")
    expect(created.get_by_role("button", name="Copy").first).to_be_visible()
    assert AgentJoinToken.objects.get().max_uses == 40
    shoot(page, "tokens")

    page.get_by_role("link", name="Agents", exact=True).click()
    expect(page.locator(".once-card")).to_have_count(0)
    expect(page.locator("body")).not_to_contain_text(token)
    page.get_by_role("button", name="Revoke rack-b12 DaemonSet").click()
    expect(page.locator(".messages")).to_contain_text("Join token rack-b12 DaemonSet revoked")
    assert AgentJoinToken.objects.get().revoked_at is not None


def test_a_power_limit_off_the_pools_boards_is_refused_beside_its_field_with_the_range(page, live_server, fleet):
    actor = Actor.system("test")
    policy = sharing_services.qos_policy_create(actor=actor, name="tuned", power_limit_w=600)
    sharing_services.pool_set_qos_policy(actor=actor, pool=fleet["inference"], policy=policy)
    sign_in(page, live_server, "ui-admin", f"/qos/{policy.pk}/edit/")
    message = "Power limit 5000 W is outside 200–700 W for H100 80GB HBM3 (pool inference)."
    page.get_by_label("Power limit").fill("5000")
    expect(page.locator("#err-power_limit_w")).to_have_text(message)  # live, as typed
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator("#err-power_limit_w")).to_have_text(message)  # and on saving: refused
    policy.refresh_from_db()
    assert policy.power_limit_w == 600
    page.get_by_label("Power limit").fill("650")
    expect(page.locator("#err-power_limit_w")).to_have_text("")
    page.get_by_role("button", name="Save changes").click()
    expect(page.get_by_role("heading", name="tuned", level=1)).to_be_visible()
    policy.refresh_from_db()
    assert policy.power_limit_w == 650
