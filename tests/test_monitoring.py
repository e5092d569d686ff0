"""The alert rules, their unit tests, the runbooks and the Grafana dashboard: checked with Debian's promtool (which
`make test` installs), and every query held to the metrics Tessera exports."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.processes import required_binary

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "tessera.rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tessera.rules.test.yaml"
PROMETHEUS_RULE = ROOT / "deploy" / "base" / "prometheus-rule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "tessera-dashboard.json"
RUNBOOKS = ROOT / "docs" / "runbooks"
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """The Tessera series an expression reads, as family names (histogram and counter suffixes removed)."""
    names = set()
    for name in re.findall(r"\btessera_[a-z0-9_]+", expr):
        for suffix in SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        names.add(name)
    return names


@pytest.fixture
def exported(db, client, viewer) -> set[str]:
    """Every metric family /metrics declares (an empty database still declares each one), read as a viewer."""
    client.force_login(viewer)
    text = client.get("/metrics").content.decode()
    return metric_names(" ".join(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE)))


def test_promtool_checks_the_rules():
    promtool = required_binary("promtool", "prometheus")
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    promtool = required_binary("promtool", "prometheus")
    result = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_is_unit_tested_firing_and_has_its_runbook():
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    for rule in alerts():
        name = rule["alert"]
        assert name in tested, f"{name} has no promtool test in which it fires"
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks/{name}.md"
        runbook = (RUNBOOKS / f"{name}.md").read_text()
        for heading in ("## What it means", "## How to look", "## What to do"):
            assert heading in runbook, f"{name}.md lacks '{heading}'"
        assert "kubectl" in runbook and "Tessera" in runbook, name
    assert {p.stem for p in RUNBOOKS.glob("Tessera*.md")} == {r["alert"] for r in alerts()}


def test_the_prometheus_rule_holds_the_same_groups():
    resource = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (resource["apiVersion"], resource["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert resource["spec"] == yaml.safe_load(RULES.read_text()), "copy deploy/prometheus/tessera.rules.yaml's groups"


def test_rules_read_only_metrics_tessera_exports(exported):
    for rule in alerts():
        missing = metric_names(rule["expr"]) - exported
        assert not missing, f"{rule['alert']} reads {missing}, which /metrics does not export"


def _panels(dashboard: dict):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_the_dashboard_is_well_formed_and_queries_exported_metrics(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    assert {"uid", "title", "panels", "schemaVersion", "templating"} <= set(dashboard)
    assert [v["name"] for v in dashboard["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    panels = list(_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    queried = set()
    for panel in panels:
        assert {"id", "type", "title", "gridPos"} <= set(panel), panel.get("title")
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"{panel['title']}: {target['expr']} reads no Tessera metric"
            assert not names - exported, f"{panel['title']} reads {names - exported}, not exported"
            queried |= names
    titles = {p["title"] for p in panels if p["type"] == "row"}
    assert {"Fleet sharing at a glance", "Changes in flight", "Failures", "Agents"} <= titles
    assert len(queried) >= 25  # the dashboard covers the metrics, not a sample of them
