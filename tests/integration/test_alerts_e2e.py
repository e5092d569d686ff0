"""Issue 18: a real Prometheus (Debian's) scrapes a running Tessera (gunicorn, and the cluster watcher process)
driving the simulator. Tessera rolls a MIG layout out to a node whose MIG Manager wedges at `pending`; the
TesseraNodeMigConfigPending alert goes to firing in Prometheus; the node's mig-manager is restarted, MIG Manager
reports `success`, and the alert resolves.

The rules are the production file's, with that one alert's threshold and `for:` shortened (seconds instead of
15 minutes) and evaluated every second.
"""

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml

from core.audit import Actor
from fleet.models import Node, NodePool
from sharing import services as sharing_services
from tests.processes import manage_py, prometheus_server, wait_until, web_server
from worker import reconcile
from worker.drivers import driver_for
from worker.inventory.cluster import sync_cluster_full
from worker.models import NodeChange

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "tessera.rules.yaml"
ALERT = "TesseraNodeMigConfigPending"
NODE = "gpu-node-0002"  # an H100 of the seeded fleet
H100 = "NVIDIA-H100-80GB-HBM3"


METRICS_TOKEN = "alerts-e2e-" + "x" * 24  # /metrics is closed to anonymous scrapers


def fast_rules(path: Path) -> Path:
    """The production rules with ALERT firing after 2 s pending (instead of 15 min) and held for 1 s."""
    rules = yaml.safe_load(RULES.read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == ALERT]
    rule["expr"], replaced = re.subn(r">\s*900\s*$", "> 2", rule["expr"].strip())
    assert replaced == 1, rule["expr"]
    rule["for"] = "1s"
    path.write_text(yaml.safe_dump(rules))
    return path


def api(url: str, path: str) -> dict:
    with urllib.request.urlopen(url + path, timeout=5) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def scrape_health(prometheus: str) -> set[str]:
    return {target["health"] for target in api(prometheus, "/api/v1/targets")["activeTargets"]}


def alert_state(prometheus: str) -> str:
    """`firing`, `pending` or `inactive` for ALERT on NODE, from Prometheus' HTTP API."""
    for alert in api(prometheus, "/api/v1/alerts")["alerts"]:
        if alert["labels"].get("alertname") == ALERT and alert["labels"].get("node") == NODE:
            return alert["state"]
    return "inactive"


@pytest.fixture
def sim_options():
    return {"nodes": 12, "apply_delay": 0.2}


def test_a_wedged_mig_change_fires_in_prometheus_then_resolves(sim, core, sim_cluster, tmp_path):
    cluster = sim_cluster
    driver_for(cluster).adopt_operator_configs()
    assert sim.settle()
    sync_cluster_full(cluster)
    pool = NodePool.objects.create(cluster=cluster, name="h100")
    Node.objects.filter(name=NODE).update(pool=pool)
    actor = Actor.system("test-admin")
    profile = sharing_services.profile_create(
        actor=actor, name="mig-7", mode="mig", target_products=[H100], mig_layouts={"all": {"1g.10gb": 7}}
    )
    sim.faults.update({"wedge": {NODE: 1}})  # MIG Manager's next apply there stays `pending` (mig-parted #485)

    with (
        web_server(tmp_path, workers=2, TESSERA_METRICS_TOKEN=METRICS_TOKEN) as tessera,
        manage_py(tmp_path, "watch_clusters", "--rescan", "1", name="watcher"),
        prometheus_server(
            tmp_path,
            targets=[tessera.removeprefix("http://")],
            rule_files=[fast_rules(tmp_path / "r.yml")],
            bearer_token=METRICS_TOKEN,
        ) as prom,
    ):
        wait_until(lambda: scrape_health(prom) == {"up"}, message="Prometheus to scrape Tessera")
        # Tessera drives the change: the assignment's reconcile pass plans it, the engine (eager tasks) applies it.
        sharing_services.pool_set_profile(actor=actor, pool=pool, profile=profile)
        reconcile.reconcile()
        wait_until(lambda: core.read_node(NODE).metadata.labels["nvidia.com/mig.config.state"] == "pending",
                   message="MIG Manager to go pending")  # fmt: skip
        assert NodeChange.objects.get(node__name=NODE).status == "verifying"
        wait_until(lambda: Node.objects.get(name=NODE).config_state == "pending", message="the watcher to see it")
        wait_until(lambda: alert_state(prom) == "firing", timeout=60, message=f"{ALERT} to fire")
        firing = [a for a in api(prom, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == ALERT]
        assert (
            firing[0]["labels"] | {"severity": "warning", "cluster": cluster.name, "node": NODE} == firing[0]["labels"]
        )
        assert firing[0]["annotations"]["runbook_url"] == f"docs/runbooks/{ALERT}.md"

        sim.restart_mig_manager(NODE)  # the runbook's fix: mig-manager re-reads the label and applies it
        wait_until(lambda: Node.objects.get(name=NODE).config_state == "success", message="success to be seen")
        wait_until(lambda: alert_state(prom) == "inactive", timeout=60, message=f"{ALERT} to resolve")
        (rule,) = [r for g in api(prom, "/api/v1/rules")["groups"] for r in g["rules"] if r["name"] == ALERT]
        assert rule["state"] == "inactive" and rule["health"] == "ok"
