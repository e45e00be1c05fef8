"""The metric reference itself: names follow Prometheus' conventions and match the installed Ray."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from tests.support.monitoring import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    RAY_SERVE_METRICS,
    ROOT,
    exported_series,
    metric_names,
)
from tests.unit.monitoring.generation_reference import (
    ALL_SERVICE_METRICS,
    GENERATION_METRICS,
    GENERATION_TAGS,
)

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
# The service's own metrics: the references the dashboard and alerts are checked against are what
# deployments/ defines (tests/support/monitoring.py's SERVICE_METRICS, and the generation engine's)

_KINDS = {"Counter": COUNTER, "Gauge": GAUGE, "Histogram": HISTOGRAM}


def _service_source_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """Metric ("ray_" + name) -> (kind, tag keys) of each metrics.Counter/Gauge/Histogram("name", ...) in
    deployments/, and of each StageMetrics("name", ...) (a histogram of the name it is given). The source
    is read, not imported (importing Ray is slow)."""
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for path in sorted((ROOT / "deployments").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if not re.search(r"\b(?:Counter|Gauge|Histogram|StageMetrics)\(", source):
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if func not in (*_KINDS, "StageMetrics"):
                continue
            arg = (
                node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
            )
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                continue  # StageMetrics' own Histogram(name, ...): its callers name it
            tag_keys = next((k.value for k in node.keywords if k.arg == "tag_keys"), None)
            tags = frozenset(ast.literal_eval(tag_keys)) if tag_keys is not None else frozenset()
            name = f"ray_{arg.value}"
            assert name not in found, f"{name} defined twice ({path.relative_to(ROOT)})"
            found[name] = (HISTOGRAM if func == "StageMetrics" else _KINDS[func], tags)
    return found


def test_service_metric_references_match_deployments() -> None:
    found = _service_source_metrics()
    assert {"ray_generate_time_to_first_token_ms", "ray_inference_batch_size"} <= set(found), sorted(found)
    defined = {name: kind for name, (kind, _) in found.items()}
    missing = {name: kind for name, kind in ALL_SERVICE_METRICS.items() if defined.get(name) != kind}
    assert not missing, f"referenced but not so defined in deployments/ (name: kind here): {missing}"
    unreferenced = sorted(set(defined) - set(ALL_SERVICE_METRICS))
    assert not unreferenced, f"defined in deployments/ but unknown to monitoring's references: {unreferenced}"


def test_generation_metrics_are_the_engines_and_carry_their_tags() -> None:
    found = _service_source_metrics()
    source = ROOT / "deployments" / "observability" / "generation_metrics.py"
    in_module = {
        f"ray_{node.args[0].value}"
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in _KINDS
    }
    assert in_module == set(GENERATION_METRICS), sorted(in_module ^ set(GENERATION_METRICS))
    for name, tags in GENERATION_TAGS.items():
        assert found[name][1] == tags, f"{name}: tag keys {sorted(found[name][1])}, expected {sorted(tags)}"
