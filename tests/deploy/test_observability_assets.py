"""The Grafana dashboard and the Prometheus alert rules shipped under deploy/ (the compose
stack and the k8s manifests mount them): their shape, and every metric they name.

promtool-free: each PromQL expression is checked for balanced brackets and valid range
durations, and every ``fleetgate_`` name in it must be a series a real gateway's
``/metrics`` exposes (an in-process gateway over emulated engines, with auth budgets and a
shadow policy so those series are there); every ``vllm:`` / ``sglang:`` name must be in
the captured engine expositions (tests/data/vllm_metrics.txt, sglang_metrics.txt).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from inproc import inproc_gateway

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "fleetgate.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DATA = ROOT / "tests" / "data"
METRIC = re.compile(r"(?<![\w:])(fleetgate_[a-z0-9_]+|vllm:[a-z0-9_:]+|sglang:[a-z0-9_:]+)")
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")
PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "table", "bargauge", "state-timeline",
               "heatmap", "text"}


def exposed(text: str) -> set[str]:
    """Every sample name a Prometheus text exposition can carry, from its # TYPE lines."""
    names: set[str] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[:2] != ["#", "TYPE"]:
            continue
        name, kind = parts[2], parts[3]
        names.add(name)
        if kind == "counter":
            names.add(name if name.endswith("_total") else name + "_total")
        if kind in ("histogram", "summary"):
            names.update({name + "_sum", name + "_count", name + "_bucket"})
    return names


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]


def alert_exprs() -> list[str]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def check_promql(expr: str) -> None:
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            assert depth[closing[ch]] >= 0, f"unbalanced {ch!r} in {expr}"
    assert all(v == 0 for v in depth.values()), f"unbalanced brackets in {expr}"
    for window in re.findall(r"\[([^\]]+)\]", expr):
        assert window == "$__rate_interval" or DURATION.match(window), (window, expr)
    assert METRIC.search(expr) or "up{" in expr, f"no metric in {expr}"


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    doc = json.loads(DASHBOARD.read_text())
    for key in ("uid", "title", "panels", "schemaVersion", "templating", "time", "refresh"):
        assert key in doc, key
    assert doc["uid"] == "fleetgate" and isinstance(doc["schemaVersion"], int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids, cells = set(), set()
    for panel in doc["panels"]:
        assert panel["type"] in PANEL_TYPES and panel["title"], panel
        assert panel["id"] not in ids
        ids.add(panel["id"])
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):  # no two panels overlap
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps at {(x, y)}"
                cells.add((x, y))
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs), panel["title"]
    assert sum(p["type"] != "row" for p in doc["panels"]) >= 20
    exprs = " ".join(dashboard_exprs())
    assert "vllm:" in exprs and "sglang:" in exprs and "fleetgate_" in exprs


def test_the_alert_rules_are_a_prometheus_rule_file() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"}
    groups = [g["name"] for g in doc["groups"]]
    assert len(set(groups)) == len(groups)
    alerts = set()
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels",
                                 "annotations"}, rule
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"]), rule["alert"]
            assert rule["alert"] not in alerts
            alerts.add(rule["alert"])
            assert isinstance(rule["expr"], str) and rule["expr"].strip()
            assert DURATION.match(rule.get("for", "0s")), rule
            for table in ("labels", "annotations"):
                assert all(isinstance(k, str) and isinstance(v, str)
                           for k, v in rule.get(table, {}).items()), (rule["alert"], table)
            assert rule["labels"]["severity"] in {"page", "ticket", "warning", "info"}
            assert rule["annotations"]["summary"]
    for needed in ("FleetgateErrorBudgetBurnFast", "FleetgateTTFTBudgetBurnFast",
                   "FleetgateBreakerOpen", "FleetgatePoolDown", "FleetgateTenantBudgetNearLimit",
                   "FleetgateShadowSpendNearCap"):
        assert needed in alerts


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_expression_parses(source: str) -> None:
    exprs = dashboard_exprs() if source == "dashboard" else alert_exprs()
    assert exprs
    for expr in exprs:
        check_promql(expr)


def _fleet() -> dict[str, Any]:
    models = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct"}
    return {
        "pools": [
            {"name": "mi300x-sglang", "accelerator": "mi300x", "engine": "sglang",
             "price_per_gpu_hour": 1.99, "endpoints": ["emulated://sglang/mi300x?speed=50"],
             "models": models},
            {"name": "h100-vllm", "accelerator": "h100", "engine": "vllm",
             "price_per_gpu_hour": 2.95, "endpoints": ["emulated://vllm/h100?speed=50"],
             "models": models},
        ],
        "policies": {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80},
                                  "shadow": {"pool": "h100-vllm", "fraction": 1.0}}},
        "default_policy": "cheapest",
        "auth": {"admin_keys": ["assets-admin-key-0123456"],
                 "keys": [{"name": "a", "key": "assets-tenant-key-0123456", "tenant": "a",
                           "limits": {"usd_per_day": 5}}]},
    }


async def test_every_metric_named_exists(tmp_path: Path) -> None:
    admin = {"authorization": "Bearer assets-admin-key-0123456"}
    async with inproc_gateway(_fleet(), tmp_path) as (url, _state), \
            httpx.AsyncClient(base_url=url, timeout=30) as client:
        metrics = (await client.get("/metrics", headers=admin)).text
    gateway = exposed(metrics)
    engines = exposed((DATA / "vllm_metrics.txt").read_text()) | \
        exposed((DATA / "sglang_metrics.txt").read_text())
    assert "fleetgate_tenant_budget_usd" in gateway and "fleetgate_shadow_max_usd_per_hour" \
        in gateway
    assert 'fleetgate_tenant_budget_usd{period="day",tenant="a"} 5.0' in metrics
    missing = []
    for source, exprs in (("dashboard", dashboard_exprs()), ("alerts", alert_exprs())):
        for expr in exprs:
            for name in METRIC.findall(expr):
                known = gateway if name.startswith("fleetgate_") else engines
                if name not in known:
                    missing.append(f"{source}: {name} in {expr.strip()[:80]}")
    assert not missing, "\n".join(missing)
