"""``bench run --rounds``: every HTTP system started once per round, its points marked with the round."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench import runner
from bench.cli import parse
from bench.corpus import Corpus
from bench.results import Point, RunReport, SystemInfo, summarize


class FakeServer:
    embeddings_path = "/v1/embeddings"
    base_url = "http://127.0.0.1:9"
    session_id = None

    def __init__(self, name: str, starts: list[str]) -> None:
        self.name = name
        self._starts = starts

    def start(self) -> float:
        self._starts.append(self.name)
        return 0.1

    def stop(self) -> None:
        self._starts.append(f"stop {self.name}")


@pytest.fixture
def fake_systems(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two systems that start and stop without doing anything; a measured point's rate is its call number."""
    starts: list[str] = []
    calls = iter(range(1, 1000))

    def servers(opts: object, log_dir: Path) -> Iterator[tuple[SystemInfo, FakeServer | None]]:
        yield SystemInfo("service", "service", "svc"), FakeServer("service", starts)
        yield SystemInfo("infinity-onnx", "infinity", "inf"), FakeServer("infinity-onnx", starts)
        yield SystemInfo("infinity-torch", "infinity", "inf", reason="not requested"), None

    def measured(once: object, max_other_load: float, retries: int) -> tuple[Point, list[str], int]:
        rate = float(next(calls))
        return summarize("whoever", "W1", 8, 1, 1.0, [0.01] * int(rate), 0), [], 1

    monkeypatch.setattr(runner, "servers", servers)
    monkeypatch.setattr(runner, "retry_disturbed", measured)
    monkeypatch.setattr(runner.machine, "wait_quiet", lambda: 0.0)
    return starts


def test_each_round_starts_every_system_and_marks_its_points(fake_systems: list[str], tmp_path: Path) -> None:
    opts = parse(["run", "--rounds", "3", "--w1-concurrency", "8", "--w2-concurrency", "4"])
    rep = RunReport("cmd", {}, {}, {})
    corpus = Corpus(texts=tuple(f"text {i}" for i in range(40)), seed=0)
    runner.measure_rounds(opts, rep, corpus, [], np.empty((0, 384)), tmp_path)
    assert fake_systems == ["service", "stop service", "infinity-onnx", "stop infinity-onnx"] * 3
    assert [s.name for s in rep.systems] == ["service", "infinity-onnx", "infinity-torch"]  # once each
    assert all(s.ran for s in rep.systems[:2]) and not rep.systems[2].ran
    assert rep.systems[2].reason == "not requested"
    # Two points (W1 c=8, W2 c=4) per system per round, in the order measured, marked with the round.
    assert [p.round for p in rep.points] == [1] * 4 + [2] * 4 + [3] * 4
    assert [p.req_per_s for p in rep.points] == [float(n) for n in range(1, 13)]
    assert rep.rounds == 3 and (tmp_path / "results-partial.json").is_file()


def test_one_round_is_the_plain_run(fake_systems: list[str], tmp_path: Path) -> None:
    opts = parse(["run", "--w1-concurrency", "8", "--w2-concurrency", "4"])
    rep = RunReport("cmd", {}, {}, {})
    corpus = Corpus(texts=tuple(f"text {i}" for i in range(40)), seed=0)
    runner.measure_rounds(opts, rep, corpus, [], np.empty((0, 384)), tmp_path)
    assert fake_systems == ["service", "stop service", "infinity-onnx", "stop infinity-onnx"]
    assert {p.round for p in rep.points} == {1} and rep.rounds == 1
