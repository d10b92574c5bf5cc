"""deploy/'s Grafana dashboard and Prometheus alert rules name only metrics the app exports.

What the app's GET /metrics exports is taken from the code: serving.runtime.metrics.FAMILIES (with
the suffixes Prometheus's text format gives counters and histograms), the plan gauges of
serving.runtime.dashboard.live, and what drift.MonitorCollector yields for a real monitor with a
reference, drift and explanations (the live check is in test_dashboard_browser.py).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from drift import GuaranteeCollector, GuaranteeLedger, Monitor, MonitorCollector
from serving.runtime.dashboard.live import PLAN_FAMILIES
from serving.runtime.metrics import FAMILIES
from tests.conftest import REPO_ROOT
from tests.serving.runtime.test_dashboard_view import PANE_S, T0, records

DEPLOY = REPO_ROOT / "deploy"
GRAFANA = DEPLOY / "grafana" / "willump-dashboard.json"
ALERTS = [*sorted((DEPLOY / "alerts").glob("*.yml")), *sorted((DEPLOY / "prometheus").glob("*-alerts.yml"))]
#: words in PromQL that look like metric names but are not
PROMQL_WORDS = {"sum", "max", "min", "avg", "by", "on", "and", "or", "unless", "rate", "increase", "le",
                "histogram_quantile", "label_values", "without", "ignoring", "group_left", "group_right",
                "count", "bool", "offset"}


def exported_names() -> set[str]:
    names: set[str] = set()
    for name, (kind, _, _) in FAMILIES.items():
        names |= {f"{name}_total"} if kind == "counter" else {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    names |= set(PLAN_FAMILIES)
    monitor = Monitor(attributes=["model_version", "replica", "level", "region"], metrics=["latency_ms", "score"],
                      features=["a"], level_column="level", cheap_level="0", confidence_column="confidence",
                      error_column="error", pane_seconds=PANE_S, window_panes=3, auto_reference_panes=3, clock=None)
    for p in range(10):
        monitor.ingest(records(600, p, T0 + PANE_S * p, planted=p >= 6))
    monitor.flush()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    ledger = GuaranteeLedger([{"gear": 0, "max_loss": 0.02, "cert_rows": 4000, "cert_disagreed": 40}])
    ledger.add(0, 1000, 800, 80, 2)
    registry.register(GuaranteeCollector(ledger))
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        names |= {s.name for s in family.samples}
    return names


@pytest.fixture(scope="module")
def exported():
    names = exported_names()
    assert {"drift_column_drifted", "drift_explanation_top_ratio_lower", "drift_cascade_cheap_share",
            "willump_rows_total", "willump_slo_p99_seconds"} <= names
    return names


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"label_values\((.*),\s*[a-zA-Z_]\w*\s*\)", r"\1", expr)  # Grafana: (metric, label)
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values and strings
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\{[^}]*\}", "{}", expr)  # matchers
    expr = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    words = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", expr))
    return {w for w in words if w not in PROMQL_WORDS and not w.startswith("__")}


def grafana_exprs(node) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                out.append(value)
            else:
                out += grafana_exprs(value)
    elif isinstance(node, list):
        for value in node:
            out += grafana_exprs(value)
    return out


def test_grafana_dashboard_loads_and_names_only_exported_metrics(exported):
    dash = json.loads(GRAFANA.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "job", "app"} <= variables
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"] and all(t["refId"] and t["expr"] for t in panel["targets"]), panel["title"]
    names = set().union(*(metric_names(e) for e in grafana_exprs(dash)))
    assert names and names <= exported, sorted(names - exported)
    # every family the app exports has a panel
    shown = {n.rsplit("_", 1)[0] if n.endswith(("_total", "_bucket")) else n for n in names}
    assert set(FAMILIES) <= shown, sorted(set(FAMILIES) - shown)


@pytest.mark.parametrize("path", ALERTS, ids=lambda p: p.name)
def test_alert_rules_load_and_name_only_exported_metrics(path, exported):
    doc = yaml.safe_load(path.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert rules and all(r["alert"] and r["expr"] and r["annotations"]["summary"] for r in rules)
    for rule in rules:
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), rule["alert"]
        names = metric_names(expr)
        assert names and names <= exported, (rule["alert"], sorted(names - exported))


def test_the_issue_s_alerts_are_there():
    doc = yaml.safe_load((DEPLOY / "alerts" / "willump-alerts.yml").read_text())
    exprs = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert "drift_column_drifted" in exprs["WillumpDriftFlagged"]["expr"] and exprs["WillumpDriftFlagged"]["for"]
    assert "drift_explanation_top_ratio" in exprs["WillumpOutliersExplained"]["expr"]
    assert "willump_certified_answered_share" in exprs["WillumpCheapShareBelowCertified"]["expr"]
    assert "willump_slo_p99_seconds" in exprs["WillumpP99AboveSLO"]["expr"]
    assert "willump_degraded_rows_total" in exprs["WillumpDegradedAnswers"]["expr"]
    assert "drift_guarantee_alarm" in exprs["WillumpGuaranteeAlarm"]["expr"]


def _rules(*paths):
    return [r for path in paths for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def test_the_files_loaded_together_never_page_twice_for_one_cause_and_keep_job():
    """A served app loads willump-alerts.yml with drift-alerts.yml, the monitor on its own
    loads drift-alerts.yml with drift-verdict-alerts.yml: no two rules of one set watch the same
    verdict; every aggregation keeps the scrape's job; every rule links its runbook entry."""
    alerts, drift, verdicts = (DEPLOY / "alerts" / "willump-alerts.yml", DEPLOY / "prometheus" / "drift-alerts.yml",
                               DEPLOY / "prometheus" / "drift-verdict-alerts.yml")
    runbook = (DEPLOY / "RUNBOOK.md").read_text().lower()
    for loaded in ((alerts, drift), (drift, verdicts)):
        watched = [m for r in _rules(*loaded) for m in set(re.findall(r"\b(drift_[a-z_]+)", r["expr"]))]
        assert len(watched) == len(set(watched)), watched
    for rule in _rules(alerts, drift, verdicts):
        for clause in re.findall(r"(?:sum|max) by \(([^)]*)\)", rule["expr"]):
            assert "job" in clause, (rule["alert"], clause)
        url = rule["annotations"]["runbook_url"]
        assert url == f"deploy/RUNBOOK.md#{rule['alert'].lower()}" and f"## {rule['alert'].lower()}" in runbook
