"""The Grafana dashboard (monitoring/dashboards/inferfleet-fleet.json) is valid JSON, takes
its Prometheus data source from a variable, lays its panels out on Grafana's grid, and
every query is PromQL that promtool accepts and that reads only metrics the fleet exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "monitoring" / "dashboards" / "inferfleet-fleet.json"
DOCS = REPO / "docs" / "monitoring.md"

# The series the queries may read: vLLM's (engine job), HAProxy's exporter (loadbalancer
# job), Prometheus's own ALERTS. molecule/replicated checks the vllm: and haproxy_ names
# against live engines and load balancers.
KNOWN = re.compile(r"^(vllm:[a-z0-9_]+|haproxy_[a-z0-9_]+|http_requests_total|up|ALERTS)$")
PROMQL_WORDS = {
    "sum", "max", "min", "count", "by", "rate", "histogram_quantile", "or", "vector", "and",
    "unless", "on", "le", "bool",
}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _queries(dashboard: dict) -> list[tuple[str, str]]:
    queries = [(p["title"], t["expr"]) for p in _panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), *[a-z_]+\)", var["definition"])
            assert inner, var["definition"]
            queries.append((f"variable {var['name']}", inner.group(1)))
    return queries


def test_the_data_source_is_a_variable(dashboard):
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    # No data source is baked in: every panel, query and query variable uses the variable.
    expected = {"type": "prometheus", "uid": "${datasource}"}
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == expected, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == expected, panel["title"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == expected, var["name"]
    assert "__inputs" not in dashboard


def test_panels_have_unique_ids_titles_and_fit_the_grid(dashboard):
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "inferfleet-fleet"
    for panel in panels:
        assert panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        assert pos["h"] > 0 and pos["y"] >= 0, panel["title"]


def test_the_fleet_overview_has_what_operators_look_at(dashboard):
    exprs = " ".join(expr for _, expr in _queries(dashboard))
    for needle in (
        "vllm:request_success_total",  # throughput
        "vllm:generation_tokens_total",
        "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket",
        "vllm:num_requests_waiting",  # queue
        "haproxy_backend_current_queue",
        "vllm:kv_cache_usage_perc",  # KV use
        'haproxy_server_status{proxy="inferfleet_engines"',  # per-backend state
        'code="5xx"',  # errors
    ):
        assert needle in exprs, needle


def _as_promql(expr: str) -> str:
    return (expr.replace("$__rate_interval", "5m")
            .replace("$model_name", ".*").replace("$instance", ".*"))


def test_every_query_is_promql_promtool_accepts(dashboard, tmp_path):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.fail("promtool is missing: run `make setup` (Debian's prometheus package)")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": _as_promql(expr)}
        for i, (_, expr) in enumerate(_queries(dashboard))]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    run = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_queries_read_only_metrics_the_fleet_exports(dashboard):
    for title, expr in _queries(dashboard):
        promql = re.sub(r'"[^"]*"', '""', _as_promql(expr))  # drop label values
        promql = re.sub(r"\{[^}]*\}", "", promql)  # and matchers
        promql = re.sub(r"\[[^\]]*\]", "", promql)  # and ranges
        names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", promql)) - PROMQL_WORDS
        names = {n for n in names if not re.fullmatch(r"[0-9.]+", n)}
        unknown = sorted(n for n in names if not KNOWN.match(n) and n not in {"code", "server",
                                                                                "instance",
                                                                                "inferfleet_instance"})
        assert unknown == [], f"{title}: {unknown}"


def test_the_docs_say_how_to_import_it():
    docs = DOCS.read_text()
    assert "monitoring/dashboards/inferfleet-fleet.json" in docs
    assert "Import" in docs
