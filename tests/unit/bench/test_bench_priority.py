"""The priority benchmark's report: its verdict against issue 22's targets and its place in the docs."""

from __future__ import annotations

from bench.priority import BEGIN_MARK, END_MARK, PHASES, Result, _table, _verdict, splice


def _results(p99_with: float, bulk_with: float) -> list[Result]:
    return [
        Result("interactive alone", 400, 400, 20.0, 50.0),
        Result("bulk alone", bulk_texts_per_s=200.0, bulk_requests=60),
        Result("both, with priorities", 400, 400, 30.0, p99_with, 50, 0, bulk_with),
        Result("both, without priorities", 400, 400, 60.0, 300.0, 60, 0, 190.0),
    ]


def test_the_phases_measure_each_class_alone_then_together_with_and_without():
    assert [(p.interactive, p.bulk, p.priorities) for p in PHASES] == [
        (True, False, True),
        (False, True, True),
        (True, True, True),
        (True, True, False),
    ]


def test_the_verdict_holds_both_targets():
    met = _verdict(_results(p99_with=99.0, bulk_with=100.0))
    assert "1.98x" in met[0] and "50%" in met[0] and met[0].endswith(": met")
    assert met[1].endswith("NOT met")  # 300 ms is 6x the idle p99
    assert _verdict(_results(p99_with=101.0, bulk_with=150.0))[0].endswith("NOT met")  # p99 2.02x
    assert _verdict(_results(p99_with=60.0, bulk_with=99.0))[0].endswith("NOT met")  # bulk 49.5 %


def test_the_table_and_the_docs_block():
    table = _table(_results(99.0, 100.0))
    assert "| both, with priorities | 400 / 400 | 30.0 | 99.0 | 100 | 0 |" in table
    assert "| bulk alone | - | - | - | 200 | 0 |" in table
    doc = "# Benchmarks\n\nintro\n"
    once = splice(doc, "first")
    assert once.startswith(doc.rstrip()) and BEGIN_MARK in once and once.rstrip().endswith(END_MARK)
    twice = splice(once, "second")
    assert "second" in twice and "first" not in twice and twice.count(BEGIN_MARK) == 1
