"""monitoring/grafana: an importable dashboard plotting every metric, with valid PromQL (the Generation row:
test_dashboard_generation.py)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.monitoring import (
    COUNTER,
    GAUGE,
    GPU_METRICS,
    HISTOGRAM,
    MODEL_SERIES,
    PANEL_TYPES,
    RAY_SERVE_HTTP_SERIES,
    RAY_SERVE_PLOTTED,
    ROOT,
    ROUTER_APPLICATION,
    ROUTER_SERIES,
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
from tests.unit.monitoring.generation_reference import (
    ALL_KNOWN_SERIES,
    ALL_MODEL_SERIES,
    ALL_SERVICE_METRICS,
    GENERATION_METRICS,
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
    assert {"application", "model", "deployment"} <= set(variables)
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
    for name, kind in ALL_SERVICE_METRICS.items():
        assert plotted & exported_series(name, kind), f"{name} is not plotted"
        if kind == COUNTER:
            (total,) = exported_series(name, kind)  # name + _total, as Prometheus sees a counter
            assert any(re.search(rf"\b(?:rate|increase)\(\s*{total}\b", e) for e in exprs), (
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
        unknown = metric_names(expr) - ALL_KNOWN_SERIES
        assert not unknown, f"unknown metrics {unknown} in {expr!r}"


# The service is one router application (ROUTER_APPLICATION) and one application per model: router panels
# filter by $application, model panels by $model, per-deployment Serve panels by both.
ROUTER_FILTER = 'application=~"$application"'
MODEL_FILTER = 'application=~"$model"'
BOTH_FILTER = 'application=~"$application|$model"'


def _selectors(expr: str, name: str) -> list[str]:
    """The label matchers of every selector of ``name`` in ``expr`` ("" for a bare name)."""
    return [m.group(1) or "" for m in re.finditer(rf"(?<![\w:]){name}(?![\w:])\s*(\{{[^}}]*\}})?", expr)]


def _wanted_filter(name: str) -> str | None:
    if name in ROUTER_SERIES or name in RAY_SERVE_HTTP_SERIES:
        return ROUTER_FILTER
    if name in ALL_MODEL_SERIES:
        return MODEL_FILTER
    return None


def test_dashboard_variables_fit_the_router_and_model_applications() -> None:
    variables = [var["name"] for var in load_dashboard()["templating"]["list"]]
    by_name = {var["name"]: var for var in load_dashboard()["templating"]["list"]}
    app, model, deployment = by_name["application"], by_name["model"], by_name["deployment"]

    def query(var: dict[str, object]) -> str:
        q = var["query"]
        return (q["query"] if isinstance(q, dict) else q).strip()  # type: ignore[index,union-attr]

    # The router application, textserve by default.
    match = re.fullmatch(r"label_values\((\w+),\s*application\)", query(app))
    assert match and match.group(1) in ROUTER_SERIES, query(app)
    assert app["current"]["value"] in ([ROUTER_APPLICATION], ROUTER_APPLICATION), app["current"]
    # The model applications: those that export the model's series, several at once, all by default (no
    # allValue: "All" is the list of model applications, not .*, which would take in the router too).
    match = re.fullmatch(r"label_values\((\w+),\s*application\)", query(model))
    assert match and match.group(1) in MODEL_SERIES, query(model)
    assert model["multi"] and model["includeAll"] and not model.get("allValue"), model
    assert model["current"]["value"] == ["$__all"], model["current"]
    # Deployments of both; the variables it uses are defined before it (Grafana resolves them in order).
    assert BOTH_FILTER in query(deployment), query(deployment)
    assert variables.index("application") < variables.index("deployment")
    assert variables.index("model") < variables.index("deployment")


def test_dashboard_filters_each_metric_by_the_application_that_reports_it() -> None:
    for expr in dashboard_exprs():
        for name in metric_names(expr):
            wanted = _wanted_filter(name)
            for matchers in _selectors(expr, name):
                if wanted is not None:
                    assert wanted in matchers, f"{name} needs {wanted}: {expr}"
                    assert "$model" not in matchers or wanted == MODEL_FILTER, expr
                    assert "$application" not in matchers or wanted == ROUTER_FILTER, expr
                elif "application" in matchers:  # Ray Serve's per-deployment series: every application
                    assert BOTH_FILTER in matchers, f"{name} needs {BOTH_FILTER}: {expr}"


def test_model_panels_show_each_model_application_apart() -> None:
    # $model is multi-valued and All by default: a time series of several models must not add them up.
    model_series = ALL_MODEL_SERIES - {s for name in GPU_METRICS for s in exported_series(name, GAUGE)}
    for panel, target in dashboard_targets():
        expr = target["expr"]
        if panel["type"] != "timeseries" or not metric_names(expr) & model_series:
            continue
        groupings = re.findall(r"\b(?:sum|max|min|avg|count)\s+by\s*\(([^)]*)\)", expr)
        assert groupings, f"{panel['title']}: {expr}"
        for labels in groupings:
            assert "application" in re.split(r"\s*,\s*", labels.strip()), f"{panel['title']}: {expr}"
        assert "{{application}}" in target["legendFormat"], panel["title"]


# Series as the multi-application service exports them (serve_config.yaml, examples/multi-model.yaml):
# each metric only on the application that reports it, with Ray's application/deployment/replica tags.
MODEL_APPLICATIONS = ("all-MiniLM-L6-v2", "demo-mini-embedder")
# A generation model's application (task generate), named after its model like the others. Its Model
# replicas report the generate_* series and, like an Inference replica, ray_model_info, which the $model
# variable lists the model applications by.
GENERATION_APPLICATIONS = ("demo-gpt2-lm",)
# Grafana's interpolation for Prometheus: a multi-value (or All) variable is (v1|v2), one value is itself.
VARIABLE_VALUES = {
    "application": ROUTER_APPLICATION,
    "model": "(" + "|".join(MODEL_APPLICATIONS + GENERATION_APPLICATIONS) + ")",
    "deployment": ".*",  # its allValue
}
SERVE_PER_DEPLOYMENT = {
    "ray_serve_deployment_error_counter_total": ({"exception_type": "RuntimeError"}, COUNTER),
    "ray_serve_deployment_processing_latency_ms": ({}, HISTOGRAM),
    "ray_serve_deployment_queued_queries": ({}, GAUGE),
    "ray_serve_replica_processing_queries": ({}, GAUGE),
    "ray_serve_deployment_request_counter_total": ({}, COUNTER),
    "ray_serve_deployment_replica_healthy": ({}, GAUGE),
    "ray_serve_replica_utilization_percent": ({}, GAUGE),
}


def _realistic_series() -> list[tuple[str, dict[str, str], str]]:
    out: list[tuple[str, dict[str, str], str]] = []
    router = {"application": ROUTER_APPLICATION, "deployment": "Ingress", "replica": "r0uter01"}
    http = {"application": ROUTER_APPLICATION, "route": "/v1/embeddings", "method": "POST"}
    for code in ("200", "503"):
        out.append(("ray_requests_total", {**router, "route": "embeddings", "status_code": code}, COUNTER))
    out.append(("ray_rejected_total", {**router, "reason": "overloaded"}, COUNTER))
    for tenant, code in (("search", "200"), ("bulk", "429")):
        tags = {**router, "tenant": tenant, "status_code": code}
        out.append(("ray_tenant_requests_total", tags, COUNTER))
    out.append(("ray_tenant_input_tokens_total", {**router, "tenant": "search"}, COUNTER))
    for transport in ("link", "handle"):
        out.append(("ray_model_calls_total", {**router, "transport": transport}, COUNTER))
    out.append(("ray_serve_http_request_latency_ms", {**http, "status_code": "200"}, HISTOGRAM))
    out.append(("ray_serve_num_http_requests_total", {**http, "status_code": "200"}, COUNTER))
    out.append(("ray_serve_num_http_error_requests_total", {**http, "error_code": "503"}, COUNTER))
    out.append(
        (
            "ray_serve_num_deployment_http_error_requests_total",
            {**router, **http, "error_code": "503"},
            COUNTER,
        )
    )
    out.append(("ray_serve_num_ongoing_http_requests", {"node_ip_address": "10.0.0.1"}, GAUGE))
    deployments = [router]
    for i, app in enumerate(MODEL_APPLICATIONS):
        tags = {
            d: {"application": app, "deployment": d, "replica": f"m{i}{d[:6].lower()}"}
            for d in ("Model", "Tokenizer", "Inference", "Serializer")
        }
        deployments += tags.values()
        inference = {**tags["Inference"], "instance": "10.0.0.1:8080"}
        for name in ("batch_size", "batch_tokens", "padding_efficiency", "queue_wait_ms", "per_sample_ms"):
            out.append((f"ray_inference_{name}", inference, HISTOGRAM))
        out.append(("ray_inference_queue_length", inference, GAUGE))
        info = {"model": app, "version": "1", "backend": "torch", "device": "cuda:0"}
        out.append(("ray_model_info", {**inference, **info}, GAUGE))
        out.append(("ray_gpu_utilization_percent", {**inference, "device": str(i)}, GAUGE))
        out.append(("ray_gpu_memory_used_bytes", {**inference, "device": str(i)}, GAUGE))
        for transport in ("link", "handle"):
            out.append(("ray_inference_calls_total", {**tags["Model"], "transport": transport}, COUNTER))
        out.append(("ray_tokenize_ms", tags["Tokenizer"], HISTOGRAM))
        out.append(("ray_serialize_ms", tags["Serializer"], HISTOGRAM))
    for i, app in enumerate(GENERATION_APPLICATIONS):
        generator = {"application": app, "deployment": "Model", "replica": f"g{i}nerat0"}
        deployments.append(generator)
        info = {"model": app, "version": "1", "backend": "torch", "device": "cpu"}
        out.append(("ray_model_info", {**generator, **info}, GAUGE))
        for name, kind in GENERATION_METRICS.items():
            if name == "ray_generate_requests":
                for finish in ("stop", "length", "cancelled"):
                    out.append((name, {**generator, "model": app, "finish": finish}, kind))
            else:
                out.append((name, {**generator, "model": app}, kind))
    for labels in deployments:
        for name, (extra, kind) in SERVE_PER_DEPLOYMENT.items():
            out.append((name, {**labels, **extra}, kind))
    return out


def _input_series() -> list[dict[str, str]]:
    def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return {"series": f"{name}{{{inner}}}", "values": values}

    out = []
    for name, labels, kind in _realistic_series():
        if kind == HISTOGRAM:
            for le in ("10.0", "+Inf"):
                out.append(series(f"{name}_bucket", {**labels, "le": le}, "0+4x40"))
            out.append(series(f"{name}_sum", labels, "0+20x40"))
            out.append(series(f"{name}_count", labels, "0+4x40"))
        else:
            (exported,) = exported_series(name, kind)  # a counter's series ends in _total
            out.append(series(exported, labels, "0+4x40" if kind == COUNTER else "3x40"))
    return out


def _with_values(expr: str) -> str:
    expr = re.sub(r"\$\{?__(?:rate_)?(?:interval|range)\}?", "1m", expr)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: VARIABLE_VALUES[m.group(1)], expr)


def test_every_panel_and_variable_has_data_from_the_multi_application_service(tmp_path: Path) -> None:
    # Every panel query (and variable selector), with the variables' defaults, on series labelled as the
    # router and model applications export them, returns something: no panel filters a metric by an
    # application that never reports it.
    exprs = [(f"{panel['title']} {target['refId']}", target["expr"]) for panel, target in dashboard_targets()]
    exprs += [(f"variable selector {q}", q) for q in variable_queries()]
    (tmp_path / "empty_rules.yml").write_text("groups: []\n")
    doc = {
        "rule_files": ["empty_rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "name": "dashboard",
                "interval": "15s",
                "input_series": _input_series(),
                "promql_expr_test": [
                    {
                        "expr": f"clamp_max(count({_with_values(expr)}), 1)",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                    for _, expr in exprs
                ],
            }
        ],
    }
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, "panels without data:\n" + result.stdout + result.stderr


def test_router_application_is_the_one_of_the_serve_configs() -> None:
    for config in ("serve_config.yaml", "examples/multi-model.yaml"):
        apps = yaml.safe_load((ROOT / config).read_text())["applications"]
        routers = [a["name"] for a in apps if a["import_path"].endswith(":build_router")]
        assert routers == [ROUTER_APPLICATION], config
        assert {a["name"] for a in apps} - {ROUTER_APPLICATION}, f"{config}: no model application"


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


def test_dashboard_panels_do_not_overlap() -> None:
    # Expanded rows lay out their panels on the dashboard's own grid (collapsed rows keep theirs inside).
    cells: dict[tuple[int, int], str] = {}
    for panel in load_dashboard()["panels"]:
        pos = panel["gridPos"]
        for y in range(pos["y"], pos["y"] + pos["h"]):
            for x in range(pos["x"], pos["x"] + pos["w"]):
                other = cells.setdefault((x, y), panel["title"])
                assert other == panel["title"], f"{panel['title']!r} overlaps {other!r} at x={x}, y={y}"
