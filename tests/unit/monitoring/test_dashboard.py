"""monitoring/grafana: an importable dashboard plotting every metric, with valid PromQL."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.monitoring import (
    COUNTER,
    HISTOGRAM,
    KNOWN_SERIES,
    PANEL_TYPES,
    RAY_SERVE_PLOTTED,
    SERVICE_METRICS,
    SERVICE_SERIES,
    all_panels,
    assert_ok,
    dashboard_exprs,
    dashboard_targets,
    exported_series,
    grafana_to_promql,
    load_dashboard,
    metric_names,
    promtool,
    variable_queries,
)

# ---------------------------------------------------------------------------------------------------------
# The Grafana dashboard


def test_dashboard_is_an_importable_grafana_dashboard() -> None:
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["title"] and dashboard["uid"]
    assert "__inputs" not in dashboard, "the datasource is a template variable, not an import input"
    variables = {var["name"]: var for var in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"application", "deployment"} <= set(variables)
    # Every data source reference is the variable: no uid of somebody's Grafana baked in.
    wanted = {"type": "prometheus", "uid": "${datasource}"}
    for panel in all_panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == wanted, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == wanted, panel["title"]
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == wanted, var["name"]


def test_dashboard_panel_ids_are_unique() -> None:
    ids = [panel["id"] for panel in all_panels(load_dashboard()["panels"])]
    assert all(isinstance(i, int) for i in ids)
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"duplicate panel ids: {duplicates}"


def test_dashboard_panels_are_well_formed_and_grouped_in_rows() -> None:
    panels = load_dashboard()["panels"]
    assert panels[0]["type"] == "row", "the first panel should open a row"
    assert sum(p["type"] == "row" for p in panels) >= 4
    for panel in all_panels(panels):
        assert panel["type"] in PANEL_TYPES, panel
        x, w, h = panel["gridPos"]["x"], panel["gridPos"]["w"], panel["gridPos"]["h"]
        assert w > 0 and h > 0 and x >= 0 and x + w <= 24, panel["title"]  # Grafana's grid is 24 wide
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel.get("description"), panel["id"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    assert {p["type"] for p in panels} >= {"timeseries", "heatmap", "stat"}


def test_dashboard_plots_every_service_metric() -> None:
    exprs = dashboard_exprs()
    plotted = set().union(*(metric_names(e) for e in exprs))
    for name, kind in SERVICE_METRICS.items():
        assert plotted & exported_series(name, kind), f"{name} is not plotted"
        if kind == COUNTER:
            assert any(re.search(rf"\b(?:rate|increase)\(\s*{name}\b", e) for e in exprs), (
                f"{name}: not as rate"
            )
        if kind == HISTOGRAM:
            # Quantiles or a heatmap, both from the buckets.
            assert any(
                f"{name}_bucket" in target["expr"]
                and ("histogram_quantile(" in target["expr"] or panel["type"] == "heatmap")
                for panel, target in dashboard_targets()
            ), f"{name}: no quantile or heatmap of {name}_bucket"


def test_dashboard_plots_ray_serves_own_metrics() -> None:
    plotted = set().union(*(metric_names(e) for e in dashboard_exprs()))
    assert plotted >= RAY_SERVE_PLOTTED, f"not plotted: {RAY_SERVE_PLOTTED - plotted}"
    assert any(
        "histogram_quantile(0.99" in e and "ray_serve_http_request_latency_ms_bucket" in e
        for e in dashboard_exprs()
    ), "no Ray Serve HTTP p99 latency"


def test_dashboard_uses_only_exported_metrics() -> None:
    for expr in [*dashboard_exprs(), *variable_queries()]:
        unknown = metric_names(expr) - KNOWN_SERIES
        assert not unknown, f"unknown metrics {unknown} in {expr!r}"


def test_dashboard_filters_the_service_metrics_by_application() -> None:
    for expr in dashboard_exprs():
        if metric_names(expr) & SERVICE_SERIES:
            assert 'application=~"$application"' in expr, expr


def test_dashboard_exprs_are_valid_promql(tmp_path: Path) -> None:
    # promtool parses rule expressions: every panel query becomes a recording rule.
    rules = [
        {
            "record": f"dashboard:panel_{panel['id']}_{target['refId']}",
            "expr": grafana_to_promql(target["expr"]),
        }
        for panel, target in dashboard_targets()
    ]
    rules += [
        {"record": f"dashboard:variable_{i}", "expr": grafana_to_promql(query)}
        for i, query in enumerate(variable_queries())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert_ok(promtool("check", "rules", str(path)))


def test_promql_check_rejects_a_broken_expr(tmp_path: Path) -> None:
    # The check above can fail: one unbalanced parenthesis is reported.
    path = tmp_path / "dashboard_rules.yml"
    rule = {
        "record": "dashboard:broken",
        "expr": grafana_to_promql("sum(rate(ray_requests_total[$__rate_interval])"),
    }
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [rule]}]}))
    assert promtool("check", "rules", str(path)).returncode != 0
