"""monitoring/alerts.yml: valid, unit-tested with promtool, and every alert fires when it should."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.support.monitoring import (
    ALERTS_TEST_YML,
    ALERTS_YML,
    RAY_SERVE_HTTP_SERIES,
    ROOT,
    ROUTER_APPLICATION,
    ROUTER_SERIES,
    SEVERITIES,
    alert_rules,
    assert_ok,
    metric_names,
    promtool,
)
from tests.unit.monitoring.generation_reference import (
    ALL_KNOWN_SERIES,
    ALL_MODEL_SERIES,
    ALL_REQUIRED_ALERTS,
    GENERATION_SERIES,
)

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
    # The GPU's traffic is its own model application's batches: not the router's requests (which carry
    # application="textserve", so the join never matches), not any other model's, and a stopped counter
    # (rate 0) is no traffic.
    ("TextServeGPUUnderutilized", "ray_inference_batch_size_count", "ray_requests_total"),
    ("TextServeGPUUnderutilized", "and on (application)", "and on ()"),
    ("TextServeGPUUnderutilized", "[5m])) > 0", "[5m]))"),
    # One replica's backlog, not a model's (or the service's) total.
    ("TextServeInferenceQueueBacklog", "max by (application, deployment, replica)", "sum by (application)"),
    # Health probes are not client traffic: not in the latency, and their 503s (replica still loading) are
    # not failed requests.
    ("TextServeLatencyP99OverSLO", '{route!~"/-/.*|.*healthz"}', ""),
    ("TextServeHighErrorRatio", 'route=~"embeddings|predict",status_code', "status_code"),
    # Task generate. The KV cache: the fraction used of used + free, at the fullest replica (one replica's
    # full cache stalls its admissions, whatever the model's other replicas hold).
    ("GenerationKVCacheExhausted", "> 0.95", "> 0.99"),
    ("GenerationKVCacheExhausted", "> 0.95", "> 0.5"),
    ("GenerationKVCacheExhausted", "max by (application, model)", "avg by (application, model)"),
    (
        "GenerationKVCacheExhausted",
        "(ray_generate_kv_cache_blocks_used + ray_generate_kv_cache_blocks_free)",
        "ray_generate_kv_cache_blocks_free",
    ),
    # The queue: one replica's, over 16.
    ("GenerationQueueBacklog", "> 16", "> 32"),
    ("GenerationQueueBacklog", "> 16", "> 5"),
    (
        "GenerationQueueBacklog",
        "max by (application, model, deployment, replica)",
        "sum by (application, model)",
    ),
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
    assert set(rules) >= ALL_REQUIRED_ALERTS, f"missing alerts: {ALL_REQUIRED_ALERTS - set(rules)}"
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
        unknown = names - ALL_KNOWN_SERIES
        assert not unknown, f"{rule.get('alert')}: unknown metrics {unknown}"


# ---------------------------------------------------------------------------------------------------------
# The multi-application shape: the router application has the requests and Serve's HTTP series, each model's
# own application the inference and GPU series. An alert that joins the two by application never fires.


def _model_applications() -> set[str]:
    apps = yaml.safe_load((ROOT / "examples" / "multi-model.yaml").read_text())["applications"]
    return {a["name"] for a in apps if a["import_path"].endswith(":build_model")}


def test_no_alert_mixes_router_and_model_series() -> None:
    router = ROUTER_SERIES | RAY_SERVE_HTTP_SERIES
    for rule in alert_rules():
        names = metric_names(rule["expr"])
        assert not (names & router and names & ALL_MODEL_SERIES), (
            f"{rule.get('alert')}: {sorted(names & router)} (router application) with "
            f"{sorted(names & ALL_MODEL_SERIES)} (model applications): never the same application"
        )


def test_alert_unit_tests_use_the_applications_that_report_each_metric() -> None:
    models = _model_applications()
    assert models and ROUTER_APPLICATION not in models
    router = ROUTER_SERIES | RAY_SERVE_HTTP_SERIES
    seen: set[str] = set()
    generation: set[str] = set()
    for test in yaml.safe_load(ALERTS_TEST_YML.read_text())["tests"]:
        for item in test["input_series"]:
            series = item["series"]
            name = series.split("{", 1)[0]
            match = re.search(r'\bapplication="([^"]*)"', series)
            assert match, f"{test['name']}: no application label in {series}"
            app = match.group(1)
            if name in router:
                assert app == ROUTER_APPLICATION, f"{test['name']}: {name} is the router's, not {app!r}"
            elif name in GENERATION_SERIES:
                # A generation model's application (examples/multi-model.yaml serves none): named after
                # the model it tags its series with, as every model application is.
                model = re.search(r'\bmodel="([^"]*)"', series)
                assert model, f"{test['name']}: no model label in {series}"
                assert app == model.group(1) != ROUTER_APPLICATION, f"{test['name']}: {series}"
                generation.add(app)
            elif name in ALL_MODEL_SERIES:
                assert app in models, f"{test['name']}: {name} is a model application's, not {app!r}"
            seen.add(app)
    assert ROUTER_APPLICATION in seen and len(seen & models) >= 2, sorted(seen)
    assert len(generation) >= 2, sorted(generation)
