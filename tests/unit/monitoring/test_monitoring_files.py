"""The Prometheus config, alert rules and Grafana dashboard in monitoring/: valid, tested, and consistent
with the metrics the service and Ray Serve really export. Fast, no Ray: promtool and file parsing only.

The metric lists here are the one reference, also used by the integration tests.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "monitoring"
PROMETHEUS_YML = MONITORING / "prometheus.yml"
ALERTS_YML = MONITORING / "alerts.yml"
ALERTS_TEST_YML = MONITORING / "alerts_test.yml"
DASHBOARD_JSON = MONITORING / "grafana" / "textserve-dashboard.json"
RAY_SD_FILE = "/tmp/ray/prom_metrics_service_discovery.json"

HISTOGRAM, COUNTER, GAUGE = "histogram", "counter", "gauge"

# The service's own metrics (ray.serve.metrics in deployments/), named as Ray exports them: "ray_" + name.
# Tags besides Ray's application/deployment/replica are in the comments.
SERVICE_METRICS: dict[str, str] = {
    "ray_inference_batch_size": HISTOGRAM,  # sequences per executed batch
    "ray_inference_batch_tokens": HISTOGRAM,  # padded tokens per batch
    "ray_inference_padding_efficiency": HISTOGRAM,  # real / padded tokens per batch, 0..1
    "ray_inference_queue_length": GAUGE,  # requests waiting for a batch
    "ray_inference_queue_wait_ms": HISTOGRAM,  # arrival at Inference -> start of its batch
    "ray_inference_per_sample_ms": HISTOGRAM,  # batch compute time / batch size
    "ray_tokenize_ms": HISTOGRAM,
    "ray_serialize_ms": HISTOGRAM,
    "ray_requests_total": COUNTER,  # route ("embeddings", "predict"), status_code ("200", "503", ...)
    "ray_rejected_total": COUNTER,  # reason ("overloaded", "deadline", "too_large", "invalid", ...)
    "ray_gpu_utilization_percent": GAUGE,  # device; absent without a GPU
    "ray_gpu_memory_used_bytes": GAUGE,  # device; absent without a GPU
    "ray_model_info": GAUGE,  # = 1; model, version, backend, device
}
GPU_METRICS = frozenset({"ray_gpu_utilization_percent", "ray_gpu_memory_used_bytes"})

# Ray Serve 2.60's own metrics as defined in ray/serve's source (name given to ray.util.metrics -> kind);
# test_ray_serve_metric_names_match_the_installed_ray checks them against the installed Ray.
# serve_num_{protocol}_... are expanded for both protocols (RequestProtocol: HTTP, gRPC -> "http", "grpc").
RAY_SERVE_METRICS: dict[str, str] = {
    "serve_actual_batch_size": HISTOGRAM,
    "serve_application_status": GAUGE,
    "serve_autoscaling_desired_replicas": GAUGE,
    "serve_autoscaling_handle_metrics_delay_ms": HISTOGRAM,
    "serve_autoscaling_policy_execution_time_ms": GAUGE,
    "serve_autoscaling_replica_metrics_delay_ms": HISTOGRAM,
    "serve_autoscaling_target_ongoing_requests": GAUGE,
    "serve_autoscaling_target_replicas": GAUGE,
    "serve_autoscaling_total_requests": GAUGE,
    "serve_batch_execution_time_ms": HISTOGRAM,
    "serve_batch_queue_length": GAUGE,
    "serve_batch_utilization_percent": HISTOGRAM,
    "serve_batch_wait_time_ms": HISTOGRAM,
    "serve_batches_processed": COUNTER,
    "serve_controller_application_state_update_duration_s": GAUGE,
    "serve_controller_control_loop_duration_s": GAUGE,
    "serve_controller_deployment_state_update_duration_s": GAUGE,
    "serve_controller_node_update_duration_s": GAUGE,
    "serve_controller_num_control_loops": GAUGE,
    "serve_controller_proxy_state_update_duration_s": GAUGE,
    "serve_controller_sleep_duration_s": GAUGE,
    "serve_deployment_error_counter": COUNTER,
    "serve_deployment_max_processing_latency_ms": GAUGE,
    "serve_deployment_processing_latency_ms": HISTOGRAM,
    "serve_deployment_queued_queries": GAUGE,
    "serve_deployment_replica_healthy": GAUGE,
    "serve_deployment_replica_starts": COUNTER,
    "serve_deployment_request_counter": COUNTER,
    "serve_deployment_status": GAUGE,
    "serve_event_loop_monitoring_iterations": COUNTER,
    "serve_event_loop_scheduling_latency_ms": HISTOGRAM,
    "serve_event_loop_tasks": GAUGE,
    "serve_grpc_request_latency_ms": HISTOGRAM,
    "serve_handle_request_counter": COUNTER,
    "serve_haproxy_ingress_router_failures": COUNTER,
    "serve_haproxy_ingress_router_latency_ms": HISTOGRAM,
    "serve_haproxy_ingress_router_requests": COUNTER,
    "serve_haproxy_ingress_router_server_mismatch": COUNTER,
    "serve_haproxy_ingress_router_truncations": COUNTER,
    "serve_haproxy_process_count": GAUGE,
    "serve_haproxy_target_mismatch": GAUGE,
    "serve_haproxy_update_latency_s": HISTOGRAM,
    "serve_health_check_failures_total": COUNTER,
    "serve_health_check_latency_ms": HISTOGRAM,
    "serve_http_request_latency_ms": HISTOGRAM,
    "serve_long_poll_host_transmission_counter": COUNTER,
    "serve_long_poll_latency_ms": HISTOGRAM,
    "serve_long_poll_pending_clients": GAUGE,
    "serve_multiplexed_get_model_requests_counter": COUNTER,
    "serve_multiplexed_model_load_latency_ms": HISTOGRAM,
    "serve_multiplexed_model_unload_latency_ms": HISTOGRAM,
    "serve_multiplexed_models_load_counter": COUNTER,
    "serve_multiplexed_models_unload_counter": COUNTER,
    "serve_num_compacted_nodes": COUNTER,
    "serve_num_deployment_grpc_error_requests": COUNTER,
    "serve_num_deployment_http_error_requests": COUNTER,
    "serve_num_grpc_error_requests": COUNTER,
    "serve_num_grpc_requests": COUNTER,
    "serve_num_http_error_requests": COUNTER,
    "serve_num_http_requests": COUNTER,
    "serve_num_multiplexed_models": GAUGE,
    "serve_num_ongoing_grpc_requests": GAUGE,
    "serve_num_ongoing_http_requests": GAUGE,
    "serve_num_ongoing_requests_at_replicas": GAUGE,
    "serve_num_router_requests": COUNTER,
    "serve_num_scheduling_tasks": GAUGE,
    "serve_num_scheduling_tasks_in_backoff": GAUGE,
    "serve_proxy_shutdown_duration_ms": HISTOGRAM,
    "serve_proxy_status": GAUGE,
    "serve_record_autoscaling_stats_failed": COUNTER,
    "serve_registered_multiplexed_model_id": GAUGE,
    "serve_replica_initialization_latency_ms": HISTOGRAM,
    "serve_replica_processing_queries": GAUGE,
    "serve_replica_reconfigure_latency_ms": HISTOGRAM,
    "serve_replica_shutdown_duration_ms": HISTOGRAM,
    "serve_replica_startup_latency_ms": HISTOGRAM,
    "serve_replica_utilization_percent": GAUGE,
    "serve_request_router_fulfillment_time_ms": HISTOGRAM,
    "serve_request_router_queue_len": GAUGE,
    "serve_reserved_slots_active": GAUGE,
    "serve_router_args_resolution_latency_ms": HISTOGRAM,
    "serve_routing_stats_delay_ms": HISTOGRAM,
    "serve_routing_stats_error": COUNTER,
    "serve_user_autoscaling_stats_latency_ms": HISTOGRAM,
}

# Ray Serve series the dashboard must plot beside ours: HTTP request rate, latency, queued queries,
# replica processing queries, error rate.
RAY_SERVE_PLOTTED = frozenset(
    {
        "ray_serve_num_http_requests_total",
        "ray_serve_http_request_latency_ms_bucket",
        "ray_serve_deployment_queued_queries",
        "ray_serve_replica_processing_queries",
        "ray_serve_num_http_error_requests_total",
    }
)

REQUIRED_ALERTS = frozenset(
    {
        "TextServeGPUUnderutilized",
        "TextServeInferenceQueueBacklog",
        "TextServeLatencyP99OverSLO",
        "TextServeHighErrorRatio",
    }
)
SEVERITIES = frozenset({"critical", "warning", "info"})
PANEL_TYPES = frozenset({"row", "timeseries", "heatmap", "stat", "table", "gauge", "bargauge", "text"})


def exported_series(name: str, kind: str) -> set[str]:
    """The series names Prometheus sees for one metric (prometheus_client rules, as Ray uses them)."""
    if kind == HISTOGRAM:
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == COUNTER:
        return {name if name.endswith("_total") else f"{name}_total"}
    return {name}


SERVICE_SERIES = {s for name, kind in SERVICE_METRICS.items() for s in exported_series(name, kind)}
# Ray also exports each counter as a deprecated gauge without "_total": not allowed here on purpose.
RAY_SERVE_SERIES = {
    s for name, kind in RAY_SERVE_METRICS.items() for s in exported_series(f"ray_{name}", kind)
}
KNOWN_SERIES = SERVICE_SERIES | RAY_SERVE_SERIES


# ---------------------------------------------------------------------------------------------------------
# Helpers


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool; a missing promtool fails the test (these checks must not silently disappear)."""
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail(
            "promtool is not on PATH: run `bash .ci/setup`, or install the Debian/Ubuntu package "
            "`prometheus` (apt-get install prometheus), which provides promtool"
        )
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"{result.args} failed:\n{result.stdout}\n{result.stderr}"


def write_local_config(
    dest: Path, sd_file: Path, scrape_interval: str | None = None, alerts_text: str | None = None
) -> Path:
    """A copy of prometheus.yml in ``dest`` that reads ``sd_file``, with alerts.yml beside it (rule_files
    resolve relative to the config). Also used by tests/integration/test_prometheus.py."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    for job in config["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(sd_file)]
    if scrape_interval is not None:
        # Timeouts above the interval are rejected; none is set in prometheus.yml, so set both.
        config["global"].update(
            scrape_interval=scrape_interval,
            scrape_timeout=scrape_interval,
            evaluation_interval=scrape_interval,
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "alerts.yml").write_text(ALERTS_YML.read_text() if alerts_text is None else alerts_text)
    path = dest / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


_PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
)
_PROMQL_CONSTANTS = frozenset({"inf", "nan"})


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (Grafana's $variables allowed): every identifier that is not
    a function, keyword, label (in {...} or by/on/... lists) or inside a string or range."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"'(?:[^'\\]|\\.)*'", "''", s)
    s = re.sub(r"\{[^}]*\}", "", s)
    s = re.sub(r"\[[^\]]*\]", "", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    # Not after a word character, "." or "$": skips the exponent in 1e3, the unit in 5m, $__interval.
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", s):
        word = match.group()
        if word in _PROMQL_KEYWORDS or word.lower() in _PROMQL_CONSTANTS:
            continue
        if s[match.end() :].lstrip().startswith("("):
            continue  # a function or aggregation
        names.add(word)
    return names


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text())


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_targets() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [
        (panel, target)
        for panel in all_panels(load_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def dashboard_exprs() -> list[str]:
    return [target["expr"] for _, target in dashboard_targets()]


def variable_queries() -> list[str]:
    """PromQL selectors inside the query variables' label_values(...)."""
    out = []
    for var in load_dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", query.strip())
        assert match, f"variable {var['name']}: expected label_values(<selector>, <label>), got {query!r}"
        out.append(match.group(1))
    return out


def alert_rules(text: str | None = None) -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS_YML.read_text() if text is None else text)
    return [rule for group in doc["groups"] for rule in group["rules"]]


def grafana_to_promql(expr: str) -> str:
    """Replace Grafana's variables with values, so promtool can parse the expression."""
    expr = re.sub(r"\$\{?__(?:rate_)?(?:interval|range)\}?", "1m", expr)
    return re.sub(r"\$\{?\w+\}?", "x", expr)


# ---------------------------------------------------------------------------------------------------------
# The helpers themselves


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (le) (rate(a_bucket{x=~"$v",le!="1"}[$__rate_interval])))',
            {"a_bucket"},
        ),
        ("sum(rate(a_total[5m])) / on (application) group_left (model) b > 1e3", {"a_total", "b"}),
        ("up == 0 and on () vector(1)", {"up"}),
        ("max by (device) (g offset 5m) < bool 20 or absent(h)", {"g", "h"}),
        ('sum without (replica) (c{route="by (x) rate(d)"})', {"c"}),
    ],
)
def test_metric_names_finds_every_selected_metric(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_exported_series_follow_prometheus_naming() -> None:
    assert exported_series("ray_requests_total", COUNTER) == {"ray_requests_total"}
    assert exported_series("ray_serve_num_http_requests", COUNTER) == {"ray_serve_num_http_requests_total"}
    assert exported_series("ray_tokenize_ms", HISTOGRAM) == {
        "ray_tokenize_ms_bucket",
        "ray_tokenize_ms_sum",
        "ray_tokenize_ms_count",
    }
    assert exported_series("ray_model_info", GAUGE) == {"ray_model_info"}


def _ray_serve_source_metrics() -> dict[str, set[str]]:
    """Metric name -> kinds, from each Counter/Gauge/Histogram(...) call in the installed ray/serve."""
    spec = importlib.util.find_spec("ray")  # finds the package without importing Ray (slow)
    assert spec is not None and spec.submodule_search_locations, "ray is not installed in this environment"
    serve_dir = Path(next(iter(spec.submodule_search_locations))) / "serve"
    kinds = {"Counter": COUNTER, "Gauge": GAUGE, "Histogram": HISTOGRAM}
    found: dict[str, set[str]] = {}
    for path in serve_dir.rglob("*.py"):
        if "tests" in path.relative_to(serve_dir).parts:
            continue
        source = path.read_text(encoding="utf-8")
        if not re.search(r"\b(?:Counter|Gauge|Histogram)\(", source):
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            # metrics.Counter(...) or Counter(...) (batching.py imports the classes).
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if func not in kinds:
                continue
            arg = (
                node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
            )
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names = [arg.value]
            elif isinstance(arg, ast.JoinedStr):  # f"serve_num_{protocol_name}_requests"
                pattern = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in arg.values)
                names = [pattern.replace("{}", protocol) for protocol in ("http", "grpc")]
            else:
                continue
            for name in names:
                if name.startswith("serve_"):  # not collections.Counter("...") or the like
                    found.setdefault(name, set()).add(kinds[func])
    return found


def test_ray_serve_metric_names_match_the_installed_ray() -> None:
    found = _ray_serve_source_metrics()
    assert found, "no Serve metrics found in Ray's source: has the way Ray defines metrics changed?"
    wrong = {
        name: (kind, sorted(found.get(name, ())))
        for name, kind in RAY_SERVE_METRICS.items()
        if kind not in found.get(name, ())
    }
    assert not wrong, f"not defined so (name: (kind here, kinds in Ray's source)): {wrong}"


# ---------------------------------------------------------------------------------------------------------
# prometheus.yml


@pytest.fixture
def ray_sd_file(tmp_path: Path) -> Path:
    """A service-discovery file as Ray writes it (node IP, several ports), independent of any running Ray."""
    path = tmp_path / "sd" / "prom_metrics_service_discovery.json"
    path.parent.mkdir()
    content = [{"labels": {"job": "ray"}, "targets": ["192.0.2.2:33913", "192.0.2.2:44217"]}]
    path.write_text(json.dumps(content))
    return path


def test_prometheus_config_passes_promtool(tmp_path: Path, ray_sd_file: Path) -> None:
    # A copy pointed at a known sd file: promtool validates the file's content when it exists, and the
    # real /tmp/ray file may be absent or belong to whatever Ray ran last.
    config = write_local_config(tmp_path / "conf", ray_sd_file)
    result = promtool("check", "config", str(config))
    assert_ok(result)
    assert "WARNING" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_prometheus_config_as_shipped_passes_promtool() -> None:
    # The file itself (rule_files resolved beside it); a missing sd file is only a warning for promtool.
    assert_ok(promtool("check", "config", str(PROMETHEUS_YML)))


def test_promtool_rejects_a_broken_config(tmp_path: Path, ray_sd_file: Path) -> None:
    config = write_local_config(tmp_path / "conf", ray_sd_file)
    config.write_text(config.read_text().replace("scrape_interval: 5s", "scrape_interval: 5 seconds"))
    assert promtool("check", "config", str(config)).returncode != 0


def test_prometheus_config_scrapes_rays_discovery_file() -> None:
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert config["global"]["scrape_interval"] == "5s"
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert [sd["files"] for sd in job["file_sd_configs"]] == [[RAY_SD_FILE]]


def test_relabel_rule_points_targets_at_localhost() -> None:
    (job,) = yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]
    (rule,) = [r for r in job["relabel_configs"] if r.get("target_label") == "__address__"]
    assert rule["source_labels"] == ["__address__"]
    # Prometheus anchors the regex and joins source labels with ";"; $1 is Go's group syntax.
    regex = re.compile(rule["regex"])
    replacement = re.sub(r"\$\{?(\d+)\}?", r"\\\1", rule["replacement"])
    for address, port in [("192.0.2.2:33913", "33913"), ("10.1.2.3:8080", "8080"), ("localhost:1", "1")]:
        match = regex.fullmatch(address)
        assert match, f"{rule['regex']!r} does not match {address}"
        assert match.expand(replacement) == f"127.0.0.1:{port}"


# ---------------------------------------------------------------------------------------------------------
# alerts.yml and alerts_test.yml


def test_alert_rules_pass_promtool_check() -> None:
    assert_ok(promtool("check", "rules", str(ALERTS_YML)))


def test_alert_rule_unit_tests_pass() -> None:
    assert_ok(promtool("test", "rules", str(ALERTS_TEST_YML)))


def test_promtool_rejects_a_rule_file_with_a_typo(tmp_path: Path) -> None:
    broken = tmp_path / "alerts.yml"
    text = ALERTS_YML.read_text()
    assert "histogram_quantile(0.99," in text
    broken.write_text(text.replace("histogram_quantile(0.99,", "histogram_quantile(0.99", 1))
    assert promtool("check", "rules", str(broken)).returncode != 0


# Each mutation breaks one alert (a threshold either way, a dropped filter): alerts_test.yml must notice
# every one, so each alert really is tested for firing on bad series and staying quiet on healthy ones.
RULE_MUTATIONS = [
    ("TextServeGPUUnderutilized", "< 20", "< 2"),  # no longer fires at 5 %
    ("TextServeGPUUnderutilized", "< 20", "< 95"),  # fires on the busy (90 %) GPU
    ("TextServeInferenceQueueBacklog", "> 100", "> 1000"),
    ("TextServeInferenceQueueBacklog", "> 100", "> 10"),
    ("TextServeLatencyP99OverSLO", "> 500", "> 5000"),
    ("TextServeLatencyP99OverSLO", "> 500", "> 50"),
    ("TextServeHighErrorRatio", "> 0.01", "> 0.5"),
    ("TextServeHighErrorRatio", "> 0.01", "> 0.001"),
    # Health probes are not traffic, and their 503s (replica still loading) are not failed requests.
    ("TextServeGPUUnderutilized", '{route=~"embeddings|predict"}', ""),
    ("TextServeHighErrorRatio", 'route=~"embeddings|predict",status_code', "status_code"),
]


@pytest.mark.parametrize(("alert", "old", "new"), RULE_MUTATIONS)
def test_alert_unit_tests_catch_a_broken_rule(tmp_path: Path, alert: str, old: str, new: str) -> None:
    doc = yaml.safe_load(ALERTS_YML.read_text())
    (rule,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert rule["expr"].count(old) == 1, f"{alert}: expected {old!r} once in {rule['expr']!r}"
    rule["expr"] = rule["expr"].replace(old, new)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copy(ALERTS_TEST_YML, tmp_path / "alerts_test.yml")
    assert_ok(promtool("check", "rules", str(tmp_path / "alerts.yml")))
    result = promtool("test", "rules", str(tmp_path / "alerts_test.yml"))
    assert result.returncode != 0, f"alerts_test.yml passed with {alert} at {new!r}:\n{result.stdout}"


def test_required_alerts_have_severity_and_annotations() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules() if "alert" in rule}
    assert set(rules) >= REQUIRED_ALERTS, f"missing alerts: {REQUIRED_ALERTS - set(rules)}"
    for name, rule in rules.items():
        assert rule.get("labels", {}).get("severity") in SEVERITIES, f"{name}: severity label"
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), f"{name}: annotations"


def test_every_alert_is_unit_tested() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(ALERTS_TEST_YML.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {rule["alert"] for rule in alert_rules() if "alert" in rule}
    assert alerts <= tested, f"alerts never expected to fire in alerts_test.yml: {alerts - tested}"


def test_alerts_use_only_exported_metrics() -> None:
    for rule in alert_rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule.get('alert')}: no metric in {rule['expr']!r}"
        unknown = names - KNOWN_SERIES
        assert not unknown, f"{rule.get('alert')}: unknown metrics {unknown}"


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
