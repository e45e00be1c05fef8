"""monitoring/grafana, task generate: the Generation row's panels and the finish reasons they filter by."""

from __future__ import annotations

import ast
import re
from typing import Any

from tests.support.monitoring import (
    ALERTS_YML,
    ROOT,
    dashboard_exprs,
    load_dashboard,
    metric_names,
)
from tests.unit.monitoring.generation_reference import (
    GENERATION_SERIES,
)

# ---------------------------------------------------------------------------------------------------------
# Task generate: the Generation row


def _rows() -> dict[str, list[dict[str, Any]]]:
    """Row title -> its panels (an expanded row's are those after it, up to the next row)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    for panel in load_dashboard()["panels"]:
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], list(panel.get("panels", [])))
        else:
            current.append(panel)
    return rows


def test_generation_row_holds_every_generation_panel() -> None:
    rows = _rows()
    assert "Generation" in rows, sorted(rows)
    generation = rows["Generation"]
    titles = {panel["title"] for panel in generation}
    assert titles >= {
        "Time to first token",
        "Inter-token latency",
        "Tokens/s",
        "Running and waiting sequences",
        "KV cache blocks",
        "KV cache used fraction",
        "Preemptions/s and cancelled/s",
        "Decode batch size",
        "Cancel lag p99",
        "Prefix cache hit rate",
        "Prefix cache blocks",
        "Speculative acceptance",
    }, sorted(titles)
    # Every generation metric in the row (a histogram by its buckets: quantiles).
    plotted = set().union(*(metric_names(t["expr"]) for p in generation for t in p["targets"]))
    wanted = {s for s in GENERATION_SERIES if not s.endswith(("_sum", "_count"))}
    assert plotted >= wanted, sorted(wanted - plotted)
    # And the generation series nowhere else: the other rows are the embedding pipeline's.
    for title, panels in rows.items():
        if title != "Generation":
            for panel in panels:
                for target in panel["targets"]:
                    assert not metric_names(target["expr"]) & GENERATION_SERIES, (title, panel["title"])


def test_generation_latency_panels_show_p50_and_p99() -> None:
    by_title = {panel["title"]: panel for panel in _rows()["Generation"]}
    for title, metric in (
        ("Time to first token", "ray_generate_time_to_first_token_ms_bucket"),
        ("Inter-token latency", "ray_generate_inter_token_latency_ms_bucket"),
    ):
        exprs = [t["expr"] for t in by_title[title]["targets"]]
        for q in ("0.5", "0.99"):
            assert any(f"histogram_quantile({q}," in e and metric in e for e in exprs), (title, q)
        assert by_title[title]["fieldConfig"]["defaults"]["unit"] == "ms", title


# The ratios the generation row plots, numerator over denominator (each a rate of the counter's _total),
# and the unit each is shown in.
GENERATION_RATIOS = {
    ("Prefix cache hit rate", "A"): (
        "ray_generate_prefix_cache_hit_tokens_total",
        "ray_generate_prefix_cache_prompt_tokens_total",
        "percentunit",
    ),
    ("Speculative acceptance", "A"): (
        "ray_generate_spec_accepted_tokens_total",
        "ray_generate_spec_proposed_tokens_total",
        "percentunit",
    ),
    ("Speculative acceptance", "B"): (
        "ray_generate_spec_tokens_total",
        "ray_generate_spec_checks_total",
        "short",
    ),
}


def _unit(panel: dict[str, Any], ref: str) -> str:
    """A target's unit: the panel's, or a byFrameRefID override's."""
    unit = panel["fieldConfig"]["defaults"]["unit"]
    for override in panel["fieldConfig"].get("overrides", []):
        if override["matcher"] == {"id": "byFrameRefID", "options": ref}:
            unit = next((p["value"] for p in override["properties"] if p["id"] == "unit"), unit)
    return unit


def test_generation_ratio_panels_divide_the_right_rates() -> None:
    by_title = {panel["title"]: panel for panel in _rows()["Generation"]}
    for (title, ref), (numerator, denominator, unit) in GENERATION_RATIOS.items():
        panel = by_title[title]
        (expr,) = [t["expr"] for t in panel["targets"] if t["refId"] == ref]
        top, bottom = expr.split(" / ")
        for part, name in ((top, numerator), (bottom, denominator)):
            assert metric_names(part) == {name}, (title, ref, part)
            assert re.fullmatch(
                rf'sum by \(application, model\) \(rate\({name}\{{application=~"\$model"\}}'
                r"\[\$__rate_interval\]\)\)",
                part.strip(),
            ), (title, ref, part)
        assert _unit(panel, ref) == unit, (title, ref)
        # The ratio's name and both metrics are in the description (without the _total Prometheus adds).
        for name in (numerator, denominator):
            assert name.removesuffix("_total") in panel["description"], (title, name)


def test_prefix_cache_blocks_are_per_replica() -> None:
    panel = {p["title"]: p for p in _rows()["Generation"]}["Prefix cache blocks"]
    exprs = sorted(t["expr"] for t in panel["targets"])
    assert exprs == [
        f'sum by (application, replica) (ray_generate_prefix_cache_blocks_{kind}{{application=~"$model"}})'
        for kind in ("free", "used")
    ], exprs
    assert all("{{replica}}" in t["legendFormat"] for t in panel["targets"])


def _finish_reasons() -> set[str]:
    """The values of the engine's ``Finish`` literal (deployments/runtime/generate/sequence.py, which
    engine.py exports it from), without importing torch."""
    package = ROOT / "deployments" / "runtime" / "generate"
    for module in ("sequence.py", "engine.py"):
        if not (package / module).exists():
            continue
        tree = ast.parse((package / module).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["Finish"]:
                assert isinstance(node.value, ast.Subscript), ast.unparse(node.value)  # Literal[...]
                values = ast.literal_eval(node.value.slice)
                return set(values) if isinstance(values, tuple) else {values}
    raise AssertionError("no Finish = Literal[...] in deployments/runtime/generate/sequence.py or engine.py")


def test_dashboard_and_alerts_filter_finish_by_reasons_the_engine_gives() -> None:
    reasons = _finish_reasons()
    assert reasons == {"stop", "length", "cancelled", "error"}, reasons
    texts = [*dashboard_exprs(), ALERTS_YML.read_text()]
    used = {m.group(1) for text in texts for m in re.finditer(r'\bfinish\s*=~?\s*"([^"]*)"', text)}
    assert used, "no panel filters ray_generate_requests by finish"
    for value in used:
        assert set(value.split("|")) <= reasons, value
