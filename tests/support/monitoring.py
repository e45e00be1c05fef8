"""The one reference for the monitoring files' tests: the metrics the service and Ray Serve export,
and helpers to run promtool and read the Prometheus config, alert rules and Grafana dashboard.
Used by tests/unit/monitoring/ and by the integration tests that scrape a running service."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
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
    "ray_inference_queue_wait_ms": HISTOGRAM,  # arrival at the model (either path) -> its batch
    "ray_inference_per_sample_ms": HISTOGRAM,  # batch compute time / batch size
    "ray_tokenize_ms": HISTOGRAM,
    "ray_serialize_ms": HISTOGRAM,
    "ray_requests_total": COUNTER,  # route ("embeddings", "predict"), status_code ("200", "503", ...)
    "ray_rejected_total": COUNTER,  # reason ("overloaded", "deadline", "too_large", "invalid", ...)
    "ray_tenant_requests_total": COUNTER,  # tenant (its name; "anonymous" without keys), status_code
    "ray_tenant_input_tokens_total": COUNTER,  # tenant
    "ray_model_calls_total": COUNTER,  # transport ("link": a Unix socket to a local replica; "handle")
    "ray_inference_calls_total": COUNTER,  # transport: the pipeline's calls to Inference, as above
    "ray_gpu_utilization_percent": GAUGE,  # device; absent without a GPU
    "ray_gpu_memory_used_bytes": GAUGE,  # device; absent without a GPU
    "ray_model_info": GAUGE,  # = 1; model, version, backend, device
}
GPU_METRICS = frozenset({"ray_gpu_utilization_percent", "ray_gpu_memory_used_bytes"})
# Which Serve application reports which: the router application ("textserve", deployment Ingress) counts the
# requests; every other metric comes from a model's own application (named after the model: Tokenizer,
# [Candidate]Inference, Serializer). Ray Serve's HTTP series are the router's too (the only application with
# a route); its per-deployment series come from every application.
ROUTER_APPLICATION = "textserve"
ROUTER_METRICS = frozenset(
    {
        "ray_requests_total",
        "ray_rejected_total",
        "ray_tenant_requests_total",
        "ray_tenant_input_tokens_total",
        "ray_model_calls_total",
    }
)
MODEL_METRICS = frozenset(SERVICE_METRICS) - ROUTER_METRICS
RAY_SERVE_HTTP_METRICS = frozenset(
    {
        "ray_serve_http_request_latency_ms",
        "ray_serve_num_http_requests",
        "ray_serve_num_http_error_requests",
        "ray_serve_num_deployment_http_error_requests",  # at the deployment that takes HTTP: the Ingress
    }
)

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
ROUTER_SERIES = {s for name in ROUTER_METRICS for s in exported_series(name, SERVICE_METRICS[name])}
MODEL_SERIES = SERVICE_SERIES - ROUTER_SERIES
RAY_SERVE_HTTP_SERIES = {
    s
    for name in RAY_SERVE_HTTP_METRICS
    for s in exported_series(name, RAY_SERVE_METRICS[name.removeprefix("ray_")])
}


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
