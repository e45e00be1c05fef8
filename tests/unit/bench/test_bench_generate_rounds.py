"""Rounds of the generation benchmark: which systems run in which round, each ratio's median, the report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import generate, generate_inprocess, generate_report, machine
from bench.generate_judge import http_ratios
from bench.generate_rounds import median_points, ratios_over_rounds, systems_in_round
from bench.generate_stats import CLOSED, OPEN, DesignRow, GenPoint, GenReport, design_ratios

SYSTEMS = ["service", "transformers-serve", "naive"]
TPS_8 = "output tokens/s service / transformers-serve, c=8"
TTFT_8 = "TTFT p99 service / transformers-serve, closed loop c=8"
NAIVE_8 = "output tokens/s service / naive, c=8"


def _pt(system: str, level: float, tps: float, ttft99: float, round_no: int, mode: str = CLOSED) -> GenPoint:
    p = GenPoint(system, mode, level, 60.0, 10, 0, int(tps * 60), tps, 1.0, ttft_p99_ms=ttft99)
    return replace(p, round=round_no)


def test_every_system_runs_in_the_first_round_the_naive_one_only_there_and_the_order_alternates() -> None:
    assert systems_in_round(SYSTEMS, 1, once=["naive"]) == SYSTEMS
    assert systems_in_round(SYSTEMS, 2, once=["naive"]) == ["transformers-serve", "service"]
    assert systems_in_round(SYSTEMS, 3, once=["naive"]) == ["service", "transformers-serve"]
    assert systems_in_round(["service"], 2, once=["naive"]) == ["service"]


def _three_rounds() -> list[GenPoint]:
    # service / peer at c=8: 1.4x, 1.6x, 1.7x (median 1.6x: met although round 1 misses);
    # TTFT p99: 1.5x, 0.9x, 0.8x (median 0.9x: met)
    points = [_pt("naive", 8, 20, 9000, 1)]
    for r, (s_tps, s_ttft) in enumerate([(140, 600), (160, 360), (170, 320)], start=1):
        points += [_pt("service", 8, s_tps, s_ttft, r), _pt("transformers-serve", 8, 100, 400, r)]
    return points


def test_each_ratio_is_judged_on_its_median_and_every_round_is_kept() -> None:
    ratios = ratios_over_rounds(_three_rounds(), 3, "service", "transformers-serve", "naive")
    by = {r.name: r for r in ratios}
    assert by[TPS_8].value == pytest.approx(1.6) and by[TPS_8].met is True
    assert "median of 3 of 3 rounds (1.40, 1.60, 1.70)" in by[TPS_8].detail
    assert by[TTFT_8].value == pytest.approx(0.9) and by[TTFT_8].met is True
    assert by[f"round 1: {TPS_8}"].met is False and by[f"round 1: {TTFT_8}"].met is False
    assert by[f"round 3: {TPS_8}"].value == pytest.approx(1.7)
    # the naive endpoint ran in round 1 only: every round's ratio against it uses that point
    assert [by[f"round {n}: {NAIVE_8}"].value for n in (1, 2, 3)] == [7.0, 8.0, 8.5]
    assert by[NAIVE_8].value == pytest.approx(8.0) and by[NAIVE_8].met is None


def test_a_ratio_missing_in_a_round_takes_the_median_of_the_others_and_one_in_none_is_unknown() -> None:
    points = [p for p in _three_rounds() if not (p.round == 2 and p.system == "service")]
    points.append(_pt("transformers-serve", 1.0, 10, 500, 2, OPEN))
    by = {r.name: r for r in ratios_over_rounds(points, 3, "service", "transformers-serve", "naive")}
    assert (
        by[TPS_8].value == pytest.approx(1.55)
        and "median of 2 of 3 rounds (1.40, n/a, 1.70)" in by[TPS_8].detail
    )
    unknown = by["TTFT p99 service / transformers-serve, open loop req/s=1"]
    assert unknown.value is None and unknown.met is None and unknown.detail.startswith("in no round")


def test_one_round_is_the_plain_ratios() -> None:
    points = [p for p in _three_rounds() if p.round == 1]
    assert ratios_over_rounds(points, 1, "service", "transformers-serve", "naive") == http_ratios(
        points, "service", "transformers-serve", "naive"
    )


def test_median_points_give_one_point_per_system_and_level() -> None:
    med = {(p.system, p.level): p for p in median_points(_three_rounds())}
    assert len(med) == 3
    assert med[("service", 8)].tokens_per_s == 160 and med[("service", 8)].ttft_p99_ms == 360
    assert med[("service", 8)].round == 0 and med[("naive", 8)].round == 1


def test_the_report_names_each_rounds_points_and_explains_the_medians() -> None:
    points = _three_rounds()
    rep = GenReport("cmd", {}, {"rounds": 3}, {}, {}, points=points)
    rep.ratios = ratios_over_rounds(points, 3, "service", "transformers-serve", "naive")
    text = generate_report.render(rep, None)
    assert "| mix | service (round 2) | 8 | 160.0 |" in text and "| mix | service | 8 | 140.0 |" in text
    assert "3 rounds: the service, its speculative runs and vLLM were started" in text
    assert f"| round 2: {TPS_8} | 1.60 | >= 1.5 | yes |" in text


def test_design_rows_measured_again_replace_the_runs_and_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_cache = DesignRow("no-cache", "a", 14.0, 1, 100, 8.0)
    disturbed = [no_cache, DesignRow("cache", "b", 9.8, 1, 100, 2.0, 0.32)]
    points = _three_rounds()
    rep = GenReport("cmd", {}, {"rounds": 3}, {"dir": str(tmp_path)}, {}, disturbed, points=points)
    rep.ratios = design_ratios(disturbed) + ratios_over_rounds(points, 3, *SYSTEMS)
    rep.save(tmp_path / "results.json")
    again = [no_cache, DesignRow("cache", "b", 3.5, 1, 100, 2.0, 0.01)]
    monkeypatch.setattr(generate_inprocess, "design_rows_apart", lambda *a, **k: again)
    monkeypatch.setattr(machine, "wait_quiet", lambda *a, **k: None)
    monkeypatch.setattr(machine, "machine_info", lambda **k: {"git": "abc1234"})

    assert generate.main(["--design-rows-into", str(tmp_path)]) == 0
    done = GenReport.load(tmp_path / "results.json")
    assert done.design_rows == again and done.points == points
    speedup = done.ratios[0]
    assert speedup.name.startswith("KV cache speed-up") and speedup.value == pytest.approx(4.0)
    assert len(done.ratios) == len(rep.ratios) and done.ratios[1:] == rep.ratios[1:]
    table = (tmp_path / "table.md").read_text()
    assert "These rows were measured again alone at" in table and "cache 9.80 s (other load 0.32)" in table
