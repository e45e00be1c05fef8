"""The generation benchmark's judged ratios (issue 52): service ÷ vLLM, with ÷ without speculative
decoding, transformers serve as context, each judged on its median over rounds; and their report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import generate_judge as judge
from bench import generate_report
from bench.generate_stats import CLOSED, OPEN, GenPoint, GenReport

S, V, T, N = "service", "vllm", "transformers-serve", "naive"


def _pt(
    system: str,
    workload: str,
    level: float,
    tps: float,
    ttft99: float,
    round_no: int = 1,
    itl50: float | None = None,
    mode: str = CLOSED,
) -> GenPoint:
    p = GenPoint(
        system, mode, level, 20.0, 10, 0, int(tps * 20), tps, 1.0, ttft_p99_ms=ttft99, itl_p50_ms=itl50
    )
    return replace(p, round=round_no, workload=workload)


def _round(r: int, s_tps: float, s_ttft: float) -> list[GenPoint]:
    """One round: the service at ``s_tps`` / ``s_ttft`` at every judged point, vLLM at 100 / 400."""
    points = []
    for workload, c in judge.JUDGED_VS_VLLM:
        points += [_pt(S, workload, c, s_tps, s_ttft, r), _pt(V, workload, c, 100, 400, r)]
    points += [
        _pt("service-nospec", "speculative", 1, 20, 300, r, itl50=50.0),
        _pt("service-spec", "speculative", 1, 40, 300, r, itl50=50.0 * (0.5 + 0.1 * r)),
    ]
    return points


def test_one_round_judges_service_over_vllm_and_spec_and_keeps_the_rest_as_context() -> None:
    points = [
        *_round(1, 120, 300),
        _pt(S, "unique", 1, 30, 200),
        _pt(V, "unique", 1, 25, 100),
        _pt(S, "unique", 0.5, 28, 500, mode=OPEN),
        _pt(V, "unique", 0.5, 29, 250, mode=OPEN),
        _pt(T, "unique", 8, 60, 900),
        _pt(N, "unique", 8, 10, 5000),
    ]
    by = {r.name: r for r in judge.ratios_over_rounds(points, 1, S, V, T, N)}
    tps = by["output tokens/s service / vllm, shared-prefix c=1"]
    assert tps.value == pytest.approx(1.2) and tps.target == ">= 1.0" and tps.met is True
    ttft = by["TTFT p99 service / vllm, unique c=32"]
    assert ttft.value == pytest.approx(0.75) and ttft.target == "<= 1.0" and ttft.met is True
    assert ttft.detail == "300 / 400 ms"
    spec = by["ITL p50 service-spec / service-nospec, speculative c=1"]
    assert spec.value == pytest.approx(0.6) and spec.target == "<= 0.6" and spec.met is True
    assert by["output tokens/s service-spec / service-nospec, speculative c=1"].target == "context"
    context = by["TTFT p99 service / vllm, unique c=1"]
    assert context.value == pytest.approx(2.0) and context.target == "context" and context.met is None
    assert by["TTFT p99 service / vllm, unique open loop 0.5 req/s"].value == pytest.approx(2.0)
    ts = by["output tokens/s service / transformers-serve, unique c=8"]
    assert ts.value == pytest.approx(2.0) and ts.target == "context" and "earlier target >= 1.5" in ts.detail
    assert by["output tokens/s service / naive, unique c=8"].value == pytest.approx(12.0)
    judged = judge.headline(list(by.values()))
    assert len(judged) == 2 * len(judge.JUDGED_VS_VLLM) + 1


def test_medians_over_rounds_judge_and_list_every_rounds_judged_ratios_only() -> None:
    # service tokens/s 90, 110, 130 against 100: 0.9, 1.1, 1.3 (median 1.1 met although round 1 misses)
    points = _round(1, 90, 500) + _round(2, 110, 380) + _round(3, 130, 390)
    points += [
        _pt(T, "unique", 8, 50, 800, 1),
        _pt(S, "unique", 1, 30, 200, 1),
        _pt(V, "unique", 1, 25, 100, 1),
    ]
    ratios = judge.ratios_over_rounds(points, 3, S, V, T, N)
    by = {r.name: r for r in ratios}
    name = "output tokens/s service / vllm, unique c=8"
    assert by[name].value == pytest.approx(1.1) and by[name].met is True
    assert "median of 3 of 3 rounds (0.90, 1.10, 1.30)" in by[name].detail
    assert by[f"round 1: {name}"].met is False and by[f"round 3: {name}"].value == pytest.approx(1.3)
    ttft = by["TTFT p99 service / vllm, shared-prefix c=8"]
    assert ttft.value == pytest.approx(0.975) and ttft.met is True  # 1.25, 0.95, 0.975
    spec = by["ITL p50 service-spec / service-nospec, speculative c=1"]
    assert spec.value == pytest.approx(0.7) and spec.met is False  # 0.6, 0.7, 0.8
    # context rows: medians only (the transformers serve point of round 1 is every round's)
    ts = by["output tokens/s service / transformers-serve, unique c=8"]
    assert ts.value == pytest.approx(2.2) and ts.target == "context"
    assert not [r for r in ratios if r.name.startswith("round ") and r.target == "context"]
    assert "median of 1 of 3 rounds" in by["TTFT p99 service / vllm, unique c=1"].detail


def test_a_missing_peer_gives_no_context_rows_and_a_missing_vllm_no_judged_value() -> None:
    points = [_pt(S, "unique", 8, 100, 300)]
    ratios = judge.ratios_over_rounds(points, 1, S, V, T, N)
    assert not [r for r in ratios if T in r.name]
    only = [r for r in ratios if r.name == "output tokens/s service / vllm, unique c=8"]
    assert only and only[0].value is None and only[0].met is None


def test_the_report_leads_with_the_judged_ratios_and_shows_workloads_and_acceptance() -> None:
    points = _round(1, 120, 300)
    points[-1].extra.update(spec_metrics={"ray_generate_spec_accepted_tokens_total": 3.0}, acceptance=0.75)
    prompts = {
        "unique": {"count": 10, "words_min": 16, "words_max": 200, "max_tokens": 64},
        "shared-prefix": {
            "count": 10,
            "words_min": 20,
            "words_max": 20,
            "max_tokens": 32,
            "system_words": 600,
        },
    }
    rep = GenReport("cmd", {}, {"rounds": 1, "warmup_s": 4, "duration_s": 18}, {}, prompts, points=points)
    rep.ratios = judge.ratios_over_rounds(points, 1, S, V, T, N)
    text = generate_report.render(rep, None)
    assert text.index("## Judged ratios") < text.index("## Closed loop") < text.index("## Ratios (same run)")
    assert "/ transformers-serve" not in text  # not in this run: no rows of n/a
    assert "| shared-prefix | service | 1 | 120.0 |" in text
    assert "`shared-prefix`: one shared system prompt" in text and "600 words" in text
    assert "| service-spec | 1 | 0.750 | accepted_tokens_total 3 |" in text
    assert "| output tokens/s service / vllm, unique c=8 | 1.20 | >= 1.0 | yes |" in text


def test_an_earlier_runs_single_prompt_mix_still_renders() -> None:
    old = {"count": 256, "tokens_min": 10, "tokens_max": 300, "max_tokens_min": 32, "max_tokens_max": 128}
    assert "256 prompts of 1-3 corpus texts" in generate_report.traffic(
        old, {"warmup_s": 10, "duration_s": 60}
    )
