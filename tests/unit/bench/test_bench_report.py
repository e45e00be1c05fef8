"""Markdown tables and the ratios the issue asks for."""

from __future__ import annotations

from dataclasses import replace

from bench.ratios import compute_ratios, ratios_over_rounds
from bench.report import END_MARK, points_table, ratios_table, render, splice_doc, systems_table
from bench.results import RunReport, SystemInfo, summarize


def _point(system: str, workload: str, conc: int, texts: int, rate: float, p99_s: float):
    n = int(rate * 10)
    latencies = [p99_s / 2] * (n - 2) + [p99_s] * 2
    return summarize(system, workload, conc, texts, 10.0, latencies, 0, client_cpu=0.05)


def _report(with_infinity: bool = True) -> RunReport:
    rep = RunReport("python -m bench run", {"nproc": 2, "cpu_model": "X"}, {}, {"texts": 100})
    rep.systems += [
        SystemInfo("inprocess-onnx", "inprocess", "onnx", ran=True),
        SystemInfo("service", "service", "svc", ran=True, check_min_cosine=1.0),
        SystemInfo(
            "infinity-onnx",
            "infinity",
            "inf",
            ran=with_infinity,
            reason="" if with_infinity else "pip failed",
        ),
    ]
    rep.points += [
        _point("inprocess-onnx", "b1", 1, 1, 80.0, 0.02),
        _point("inprocess-onnx", "b32-sorted", 1, 32, 2.0, 0.5),  # 64 seq/s: below b1, so b1 is the limit
        _point("service", "W1", 8, 1, 60.0, 0.3),
        _point("service", "W2", 4, 32, 2.0, 1.0),  # 64 seq/s
    ]
    if with_infinity:
        rep.points += [
            _point("infinity-onnx", "W1", 8, 1, 50.0, 0.4),
            _point("infinity-onnx", "W2", 4, 32, 1.0, 2.0),
        ]
    return rep


def test_points_table_has_one_row_per_point_and_all_columns() -> None:
    rep = _report()
    lines = points_table(rep.points).splitlines()
    assert len(lines) == 2 + len(rep.points)
    assert all(line.count("|") == 14 for line in lines)
    assert "| service | W2 | 4 | 32 | 2.0 | 64.0 |" in lines[5]
    assert lines[2].endswith("| 5 % | - |")  # client CPU measured, other load not


def test_ratios_from_the_same_run() -> None:
    ratios = {r.name: r for r in compute_ratios(_report(), ["service"])}
    w2_inf = ratios["service W2 seq/s ÷ Infinity's best W2 seq/s"]
    assert w2_inf.value == 2.0 and w2_inf.met is True
    limit = ratios["service W2 seq/s ÷ in-process ONNX limit"]
    assert limit.value == 0.8 and limit.met is True  # 64 / 80: the best in-process row is the limit
    assert "b1" in limit.detail
    w1 = ratios["service W1 c=8 req/s ÷ Infinity's best"]
    assert w1.value == 1.2 and w1.met is True
    p99 = ratios["service W1 c=8 p99 ÷ that Infinity's p99"]
    assert p99.met is True and p99.value == 0.75


def test_w2_against_the_model_alone_on_its_own_requests_is_context_not_a_target() -> None:
    rep = _report()
    rep.points.append(
        _point("inprocess-onnx", "b32-requests", 1, 32, 2.5, 0.5)
    )  # 2.5 calls/s of 32 texts: 80 seq/s
    ratios = {r.name: r for r in compute_ratios(rep, ["service"])}
    same = ratios["service W2 seq/s ÷ the model alone on W2's requests"]
    assert same.value == 0.8 and same.met is None and same.target == "(context)"
    assert "b32-requests" in same.detail
    row = next(line for line in ratios_table(list(ratios.values())).splitlines() if "W2's requests" in line)
    assert "| 0.80 | (context) | - |" in row
    # the row never becomes the limit unless it is the fastest one
    assert "b1" in ratios["service W2 seq/s ÷ in-process ONNX limit"].detail


def test_each_workload_is_measured_against_infinitys_best_configuration() -> None:
    rep = _report()
    rep.systems.append(SystemInfo("infinity-torch-bf16", "infinity", "inf bf16", ran=True))
    rep.points += [
        _point("infinity-torch-bf16", "W1", 8, 1, 40.0, 0.2),  # slower than infinity-onnx, lower p99
        _point("infinity-torch-bf16", "W2", 4, 32, 1.6, 2.0),  # 51.2 seq/s: faster than infinity-onnx's 32
    ]
    ratios = {r.name: r for r in compute_ratios(rep, ["service"])}
    w2 = ratios["service W2 seq/s ÷ Infinity's best W2 seq/s"]
    assert w2.value == 1.25 and w2.met is False and "infinity-torch-bf16 W2" in w2.detail
    w1 = ratios["service W1 c=8 req/s ÷ Infinity's best"]
    assert w1.value == 1.2 and "infinity-onnx W1" in w1.detail
    # The p99 bar is the p99 of the configuration with the best throughput, not the lowest p99 seen.
    p99 = ratios["service W1 c=8 p99 ÷ that Infinity's p99"]
    assert p99.value == 0.75 and "infinity-onnx" in p99.detail


def test_w2_against_the_fastest_in_process_row_of_any_backend_is_context() -> None:
    rep = _report()
    rep.systems.append(SystemInfo("inprocess-torch-bf16-trace", "inprocess", "torch bf16", ran=True))
    rep.points.append(_point("inprocess-torch-bf16-trace", "b32-sorted", 1, 32, 5.0, 0.3))  # 160 seq/s
    ratios = {r.name: r for r in compute_ratios(rep, ["service"])}
    fastest = ratios["service W2 seq/s ÷ fastest in-process row"]
    assert fastest.value == 0.4 and fastest.target == "(context)"
    assert "inprocess-torch-bf16-trace b32-sorted" in fastest.detail
    # The target keeps its own denominator: the ONNX Runtime limit.
    assert ratios["service W2 seq/s ÷ in-process ONNX limit"].value == 0.8


def test_the_model_alone_on_w2s_requests_is_run_as_the_service_runs_it() -> None:
    rep = _report()
    rep.systems.append(SystemInfo("inprocess-torch-bf16-trace", "inprocess", "torch bf16", ran=True))
    rep.points += [
        _point("inprocess-onnx", "b32-requests", 1, 32, 2.5, 0.5),  # 80 seq/s
        _point("inprocess-torch-bf16-trace", "b32-requests", 1, 32, 4.0, 0.3),  # 128 seq/s
    ]
    name = "service W2 seq/s ÷ the model alone on W2's requests"
    served = {
        r.name: r for r in compute_ratios(rep, ["service"], served_inprocess="inprocess-torch-bf16-trace")
    }
    assert served[name].value == 0.5 and "inprocess-torch-bf16-trace b32-requests" in served[name].detail
    # Without a served row (an ONNX service, or it was not measured): ONNX Runtime's row.
    for served_name in (None, "inprocess-torch-fp32-trace"):
        plain = {r.name: r for r in compute_ratios(rep, ["service"], served_inprocess=served_name)}
        assert plain[name].value == 0.8 and "inprocess-onnx b32-requests" in plain[name].detail


def test_ratios_say_why_infinity_is_missing() -> None:
    ratios = compute_ratios(_report(with_infinity=False), ["service"])
    missing = [r for r in ratios if "Infinity" in r.name]
    assert missing and all(r.value is None and r.met is None for r in missing)
    assert all("pip failed" in r.detail for r in missing)
    assert "| n/a |" in ratios_table(ratios)


def test_systems_table_flags_wrong_output() -> None:
    text = systems_table([SystemInfo("x", "infinity", "d", ran=True, check_min_cosine=0.51)])
    assert "WRONG OUTPUT" in text
    assert "WRONG" not in systems_table([SystemInfo("y", "service", "d", ran=True, check_min_cosine=0.9999)])


def test_render_contains_sections_and_plot_link() -> None:
    text = render(_report(), "plot.png")
    for part in (
        "## Systems",
        "## Results",
        "## Ratios (same run)",
        "![latency against throughput](plot.png)",
    ):
        assert part in text


def test_render_heading_level() -> None:
    assert "### Results" in render(_report(), None, level=3)
    assert "![" not in render(_report(), None)


def test_splice_doc_replaces_only_the_marked_block() -> None:
    doc = "# Benchmarks\n\nHand-written intro.\n"
    once = splice_doc(doc, "first run")
    assert once.startswith(doc.rstrip()) and "first run" in once and once.rstrip().endswith(END_MARK)
    twice = splice_doc(once + "\nHand-written outro.\n", "second run")
    assert "first run" not in twice and "second run" in twice
    assert "Hand-written intro." in twice and twice.rstrip().endswith("Hand-written outro.")
    assert twice.count(END_MARK) == 1


def test_disturbed_points_are_called_out() -> None:
    rep = _report()
    rep.options = {"max_other_load": 0.1, "retries": 2}
    rep.points[3] = summarize("service", "W2", 4, 32, 10.0, [0.5] * 20, 0, other_load=0.4)
    ratios = {r.name: r for r in compute_ratios(rep, ["service"], max_other_load=0.1)}
    assert (
        "DISTURBED: service W2 other load 40%" in ratios["service W2 seq/s ÷ Infinity's best W2 seq/s"].detail
    )
    assert "DISTURBED" not in ratios["service W1 c=8 req/s ÷ Infinity's best"].detail
    assert "1 of 6 points were measured while other processes" in render(rep)
    assert "points were measured while" not in render(_report())


def _three_rounds() -> RunReport:
    """service W1 c=8 at 60, 40 and 66 req/s against Infinity's best of each round (50, 50, 55)."""
    rep = _report()
    rep.systems.append(SystemInfo("infinity-torch-bf16", "infinity", "inf bf16", ran=True))
    one = list(rep.points)
    for round_no, service_rate, onnx_rate in ((2, 40.0, 50.0), (3, 66.0, 50.0)):
        for p in one:
            if p.system == "service" and p.workload == "W1":
                p = _point("service", "W1", 8, 1, service_rate, 0.3)
            elif p.system == "infinity-onnx" and p.workload == "W1":
                p = _point("infinity-onnx", "W1", 8, 1, onnx_rate, 0.4)
            elif p.system == "inprocess-onnx":
                continue  # measured once, shared by every round
            rep.points.append(replace(p, round=round_no))
    # In round 3 Infinity's bf16 engine is its best on W1: that round's ratio is against it.
    rep.points.append(replace(_point("infinity-torch-bf16", "W1", 8, 1, 55.0, 0.2), round=3))
    return rep


def test_one_round_gives_the_plain_ratios() -> None:
    assert ratios_over_rounds(_report(), ["service"]) == compute_ratios(_report(), ["service"])


def test_several_rounds_give_the_median_then_each_round() -> None:
    rep = _three_rounds()
    assert rep.rounds == 3
    ratios = {r.name: r for r in ratios_over_rounds(rep, ["service"])}
    name = "service W1 c=8 req/s ÷ Infinity's best"
    assert [ratios[f"round {n}: {name}"].value for n in (1, 2, 3)] == [1.2, 0.8, 1.2]
    assert ratios[f"round 2: {name}"].met is False
    assert "infinity-torch-bf16 W1" in ratios[f"round 3: {name}"].detail  # 66 / 55, that round's best
    median = ratios[name]
    assert median.value == 1.2 and median.met is True and median.target == ">= 1"
    assert median.detail == "median of 3 of 3 rounds (1.20, 0.80, 1.20)"
    # A lower-is-better target is judged the same way: p99 0.3 s vs 0.4, 0.4, and 0.2 s in round 3.
    p99 = ratios["service W1 c=8 p99 ÷ that Infinity's p99"]
    assert p99.value == 0.75 and p99.met is True and "(0.75, 0.75, 1.50)" in p99.detail
    # W2 did not change between rounds: the median is that value, context rows stay without a verdict.
    assert ratios["service W2 seq/s ÷ Infinity's best W2 seq/s"].value == 2.0
    context = ratios["service W2 seq/s ÷ fastest in-process row"]
    assert context.met is None and context.target == "(context)"
    assert len(ratios) == 4 * 7  # six rows, and W1 c=1 (not measured here)


def test_a_round_without_a_point_is_left_out_of_the_median() -> None:
    rep = _three_rounds()
    rep.points = [p for p in rep.points if not (p.round == 2 and p.system.startswith("infinity"))]
    ratios = {r.name: r for r in ratios_over_rounds(rep, ["service"])}
    median = ratios["service W1 c=8 req/s ÷ Infinity's best"]
    assert median.value == 1.2 and median.detail == "median of 2 of 3 rounds (1.20, n/a, 1.20)"
    assert ratios["round 2: service W1 c=8 req/s ÷ Infinity's best"].value is None


def test_render_of_several_rounds_has_a_round_column_and_says_how_to_read_it() -> None:
    rep = _three_rounds()
    rep.ratios = ratios_over_rounds(rep, ["service"])
    text = render(rep, None)
    assert "| system | round | workload |" in text
    assert "| service | 2 | W1 | 8 | 1 | 40.0 |" in text
    assert "started and measured 3 times" in text and "round 3: service W1" in text
    plain = render(_report(), None)
    assert "| round |" not in plain and "started and measured" not in plain
    assert all(line.count("|") == 15 for line in points_table(rep.points, with_round=True).splitlines())
