"""``bench run --rounds``: every HTTP system started once per round, its points marked with the round."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bench import loadgen, runner
from bench.cli import parse
from bench.results import Point, RunReport, SystemInfo, summarize
from deployments.tools.corpus import Corpus


class FakeServer:
    embeddings_path = "/v1/embeddings"
    description = "fake"
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
    opts = parse(
        [
            "run",
            "--rounds",
            "3",
            "--w1-concurrency",
            "8",
            "--w2-concurrency",
            "4",
            "--no-open-loop",
            "--no-mixed",
        ]
    )
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
    opts = parse(["run", "--w1-concurrency", "8", "--w2-concurrency", "4", "--no-open-loop", "--no-mixed"])
    rep = RunReport("cmd", {}, {}, {})
    corpus = Corpus(texts=tuple(f"text {i}" for i in range(40)), seed=0)
    runner.measure_rounds(opts, rep, corpus, [], np.empty((0, 384)), tmp_path)
    assert fake_systems == ["service", "stop service", "infinity-onnx", "stop infinity-onnx"]
    assert {p.round for p in rep.points} == {1} and rep.rounds == 1


def test_open_loop_rates_are_measured_on_every_system_in_every_round(
    fake_systems: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int, int, int, float]] = []
    windows: dict[int, float] = {}

    def closed(system: str, workload: str, *args: object, **kwargs: object) -> tuple[Point, list[str]]:
        return summarize(system, workload, 8, 1, 1.0, [0.01] * 5, 0), []

    def open_loop(
        system: str,
        target: object,
        requests: loadgen.Requests,
        rate: int,
        timing: object,
        seed: int,
        p99_bound_ms: float,
        server_session: int | None = None,
    ) -> tuple[Point, list[str]]:
        calls.append((system, rate, len(requests.bodies), requests.texts_per_request, p99_bound_ms))
        assert isinstance(timing, loadgen.Timing)
        windows[rate] = timing.duration_s
        return summarize(system, "W3", rate, 1, 1.0, [0.01] * rate, 0), ["HTTP 503"] if rate == 30 else []

    monkeypatch.setattr(runner, "retry_disturbed", lambda once, limit, retries: (*once(), 1))
    monkeypatch.setattr(runner.loadgen, "measure", closed)
    monkeypatch.setattr(runner.openloop, "measure", open_loop)
    argv = ["run", "--quick", "--rounds", "2", "--w1-concurrency", "1", "--w2-concurrency", "4"]
    opts = parse(
        [
            *argv,
            "--open-loop-rates",
            "30,10",
            "--open-loop-p99-ms",
            "250",
            "--open-loop-requests",
            "60",
            "--no-mixed",
        ]
    )
    rep = RunReport("cmd", {}, {}, {})
    corpus = Corpus(texts=tuple(f"text {i}" for i in range(40)), seed=0)
    runner.measure_rounds(opts, rep, corpus, [], np.empty((0, 384)), tmp_path)
    # Every started system, every round, lowest rate first, single texts from the whole corpus.
    assert calls == [(s, r, 40, 1, 250.0) for s in ("service", "infinity-onnx") for r in (10, 30)] * 2
    w3 = [(p.system, p.round, p.concurrency) for p in rep.points if p.workload == "W3"]
    assert w3 == [(s, n, r) for n in (1, 2) for s in ("service", "infinity-onnx") for r in (10, 30)]
    assert "round 2 W3 30 req/s errors, e.g. HTTP 503" in rep.systems[0].reason
    assert windows == {10: 6.0, 30: 3.0}  # 60 arrivals at 10 req/s need 6 s; at 30 the 3-s window holds them


def test_only_the_infinity_configs_asked_for_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    env = object()
    monkeypatch.setattr(runner.infinity, "ensure_venv", lambda venv, log: env)
    monkeypatch.setattr(runner.infinity, "prepare_model", lambda env, src, dest, log: tmp_path)
    monkeypatch.setattr(runner, "systems_model_dir", lambda: tmp_path)

    def infinity_server(
        env: object, config: runner.infinity.InfinityConfig, model: Path, log: Path
    ) -> object:
        started.append(config.label)
        return FakeServer(config.label, [])

    monkeypatch.setattr(runner.systems, "infinity_server", infinity_server)
    opts = parse(
        ["run", "--no-service", "--no-naive", "--with-infinity", "--infinity-configs", "infinity-onnx"]
    )
    listed = [(info.name, server is not None, info.reason) for info, server in runner.servers(opts, tmp_path)]
    assert started == ["infinity-onnx"]
    why = "not requested (--with-infinity, --infinity-configs)"
    assert listed == [
        ("infinity-torch", False, why),
        ("infinity-torch-bf16", False, why),
        ("infinity-onnx", True, ""),
    ]
    every = parse(["run", "--no-service", "--no-naive", "--with-infinity"])
    assert [info.name for info, server in runner.servers(every, tmp_path) if server] == [
        "infinity-torch",
        "infinity-torch-bf16",
        "infinity-onnx",
    ]
    with pytest.raises(SystemExit):
        parse(["run", "--infinity-configs", "infinity-gpu"])


def test_mixed_sizes_are_measured_on_every_system_in_every_round_after_priming(
    fake_systems: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, float, int, float, float]] = []
    primed: list[tuple[str, int]] = []

    def mixed(
        system: str,
        target: loadgen.Target,
        texts: tuple[str, ...],
        rate: float,
        timing: loadgen.Timing,
        seed: int,
        p99_bound_ms: float,
        server_session: int | None = None,
    ) -> tuple[Point, list[str]]:
        calls.append((system, rate, len(texts), timing.duration_s, p99_bound_ms))
        return summarize(system, "W4", 0, 15, 1.0, [0.01] * 5, 0), []

    monkeypatch.setattr(runner, "retry_disturbed", lambda once, limit, retries: (*once(), 1))
    monkeypatch.setattr(runner.mixed, "measure", mixed)
    monkeypatch.setattr(
        runner.systems, "fetch_embeddings", lambda url, texts, t: primed.append((url, len(texts)))
    )
    argv = ["run", "--rounds", "2", "--workloads", "mixed", "--mixed-rate", "2", "--mixed-requests", "100"]
    opts = parse([*argv, "--mixed-p99-ms", "4000", "--quiet-wait", "0"])
    rep = RunReport("cmd", {}, {}, {})
    corpus = Corpus(texts=tuple(f"text {i}" for i in range(300)), seed=0)
    runner.measure_rounds(opts, rep, corpus, [], np.empty((0, 384)), tmp_path)
    # W4 alone: 100 arrivals at 2 req/s need a 50-s window; every system, every round, the whole corpus.
    assert calls == [(s, 2.0, 300, 50.0, 4000.0) for s in ("service", "infinity-onnx")] * 2
    assert [(p.system, p.round, p.workload) for p in rep.points] == [
        (s, n, "W4") for n in (1, 2) for s in ("service", "infinity-onnx")
    ]
    assert [n for _, n in primed] == [32, 256] * 4  # one request of each large size before each window
