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
    exported_series,
    metric_names,
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
