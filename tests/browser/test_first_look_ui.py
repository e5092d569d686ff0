"""A new user's first minutes with a fresh `make run` (its real command, in a fresh var directory): the overview leads
to the demo pool, whose schedule (demo pace) previews a switch, runs it node by node and says what runs until when,
while MIG Manager's labels change in the simulator and the Kueue quota follows; and the terminal stays a status,
with no line per request.

One stack for the module: the switch comes within the demo's 2 minutes, the terminal is read after it."""

import re
import time

import pytest
from kubernetes import client, config
from playwright.sync_api import expect

from tests.processes import MAKE_RUN_PASSWORD, free_port, make_run, wait_until

pytestmark = pytest.mark.browser

POOL = "demo-day-night"
PER_REQUEST = re.compile(r'"(GET|POST|PUT|PATCH|DELETE|HEAD) /[^"]*HTTP/1\.[01]" \d{3}|Task [\w.]+\[[0-9a-f-]{36}\]')


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A fresh `make run` (12 simulated nodes, 2 agents reporting every 15 s); yields (URL, terminal, var dir,
    start)."""
    var_dir = tmp_path_factory.mktemp("make-run")
    port = free_port()
    options = ("--sim-nodes", "12", "--sim-agents", "2")
    with make_run(var_dir, var_dir / "terminal.log", port, *options) as output:
        yield f"http://127.0.0.1:{port}", output, var_dir, time.monotonic()


def _mig_labels(var_dir, nodes) -> dict[str, tuple[str, str]]:
    """(nvidia.com/mig.config, nvidia.com/mig.config.state) of each node, as kubectl -L shows them."""
    with config.new_client_from_config(config_file=str(var_dir / "sim" / "kubeconfig")) as api:
        core = client.CoreV1Api(api)
        labels = {name: core.read_node(name).metadata.labels for name in nodes}
    return {n: (lab.get("nvidia.com/mig.config"), lab.get("nvidia.com/mig.config.state")) for n, lab in labels.items()}


def test_the_demo_pool_previews_its_scheduled_switch_then_runs_it_node_by_node(page, stack):
    base, output, var_dir, _ = stack
    assert f"Watch a day/night switch: {base}/pools/" in output()
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(base + "/login/?next=/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(MAKE_RUN_PASSWORD)
    page.get_by_role("button", name="Sign in").click()

    # The overview points at the demo pool and at the kubectl line that shows its nodes.
    guide = page.locator("#first-look")
    expect(guide).to_contain_text("kubectl --kubeconfig")
    guide.get_by_role("link", name=POOL).click()
    expect(page.get_by_role("heading", name=POOL)).to_be_visible()
    pool_url = page.url
    nodes = re.search(r"kubernetes\.io/hostname in \(([^)]*)\)", page.locator("body").inner_text())[1].split(",")
    assert len(nodes) == 3

    # The preview: the schedule (named for its demo pace) says what comes next and when, and what it does.
    schedule = page.locator("#pool-schedule")
    expect(schedule).to_contain_text("demo pace")
    next_profile = re.search(r"next: (\S+) from \w+ \d\d:\d\d", schedule.inner_text())[1]
    schedule.get_by_role("link").click()
    impact = page.locator("section[aria-labelledby=impact-heading]")
    expect(impact).to_contain_text(f"switches to {next_profile}")
    before = _mig_labels(var_dir, nodes)

    # The switch starts: the pool page shows the rollout toward the next profile in progress…
    page.goto(pool_url)
    rollouts = page.locator("#pool-rollouts")

    def rollout_in_progress():
        page.reload()
        link = rollouts.get_by_role("link", name=re.compile(r"#\d+"))
        return link.count() == 1 and f"→ {next_profile}" in rollouts.inner_text() and link.get_attribute("href")

    rollout_path = wait_until(rollout_in_progress, timeout=200, interval=0.5, message=f"a rollout to {next_profile}")

    # …then finishes: every node changed, and the page says what runs now and until when.
    def finished():
        page.reload()
        return "None: its nodes are not changing." in rollouts.inner_text()

    wait_until(finished, timeout=90, interval=1, message="the rollout to finish")
    now = page.locator("#pool-now")
    expect(now.get_by_role("link", name=next_profile)).to_be_visible()
    expect(page.locator("#pool-why")).to_contain_text(re.compile(r"until \d\d:\d\d"))
    page.goto(base + rollout_path)
    expect(page.locator("#rollout-live .badge").first).to_have_text("Succeeded")
    expect(page.locator("body")).to_contain_text("3/3")

    # MIG Manager's labels in the simulator (the banner's kubectl line) changed on every node, and settled.
    after = _mig_labels(var_dir, nodes)
    assert {state for _, state in after.values()} == {"success"}
    assert all(after[n][0] != before[n][0] for n in nodes), (before, after)
    assert re.search(rf"Rollout #\d+ started: {POOL} → {next_profile} \(3 nodes\) — by demo day/night", output())

    # The Kueue quota the pool is bound to moves with the layout: the resource of the new profile is written.
    resource = "nvidia.com/gpu" if next_profile == "demo-whole-gpus" else "nvidia.com/mig-1g.10gb"
    page.goto(pool_url)

    def written() -> bool:
        page.reload()
        row = page.locator("#kueue-quota tr", has=page.get_by_text(resource, exact=True))
        return row.count() == 1 and row.locator("td").last.inner_text().strip() not in ("0", "—", "")

    wait_until(written, timeout=90, interval=2, message=f"Kueue quota of {resource} written")


def test_a_minute_of_make_run_writes_no_line_per_request_to_its_terminal(stack):
    base, output, var_dir, started = stack
    time.sleep(max(0.0, 60 - (time.monotonic() - started)))
    terminal = output().split("Tessera is running", 1)[1]
    assert not PER_REQUEST.findall(terminal), terminal[-3000:]
    assert "Sending due task" not in terminal and "celery@" not in terminal
    access = (var_dir / "log" / "access.log").read_text()
    assert '"POST /api/v1/agent/report/ HTTP/1.1" 200' in access  # the agents' reports are there instead
    assert re.search(r"Rollout #\d+ succeeded: ", terminal)  # what matters still shows
