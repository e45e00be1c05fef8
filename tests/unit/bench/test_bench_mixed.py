"""The mixed-size open-loop workload W4: its size mix from a seed, the per-class summary, one window end to
end against a small local server."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.loadgen import Target, Timing
from bench.mixed import (
    MAX_TEXTS,
    MAX_WINDOW_S,
    MIX,
    compose,
    describe,
    draw_sizes,
    encode,
    mean_texts,
    measure,
    size_class,
    status,
    summarize_mixed,
    window_s,
)
from bench.openloop import Arrival, Drive


def test_the_size_mix_has_its_proportions_from_a_seed() -> None:
    sizes = draw_sizes(20_000, seed=5)
    assert sizes == draw_sizes(20_000, seed=5) and sizes != draw_sizes(20_000, seed=6)
    share = Counter(size_class(n) for n in sizes)
    # 20 000 draws: one standard deviation of a share p is sqrt(p(1-p)/n) = 0.28 % at 80 %, 0.12 % at 3 %.
    assert abs(share["1-4"] / 20_000 - 0.80) < 0.012
    assert abs(share["32"] / 20_000 - 0.17) < 0.012
    assert abs(share["256"] / 20_000 - 0.03) < 0.005
    small = Counter(n for n in sizes if n <= 4)
    assert sorted(small) == [1, 2, 3, 4] and all(
        abs(c / sum(small.values()) - 0.25) < 0.02 for c in small.values()
    )
    assert set(sizes) <= {1, 2, 3, 4, 32, 256} and max(sizes) == MAX_TEXTS
    assert abs(sum(sizes) / len(sizes) - mean_texts()) / mean_texts() < 0.05


def test_the_mix_is_documented_by_its_numbers() -> None:
    assert mean_texts() == pytest.approx(0.8 * 2.5 + 0.17 * 32 + 0.03 * 256)  # 15.12 texts per request
    assert describe() == "80% 1-4, 17% 32, 3% 256 texts per request (15.1 on average)"
    assert [c.label for c in MIX] == ["1-4", "32", "256"]


def test_each_request_carries_distinct_corpus_texts_of_its_size() -> None:
    texts = [f"text number {i}" for i in range(300)]
    groups = compose([1, 4, 32, 256], texts, seed=3)
    assert [len(g) for g in groups] == [1, 4, 32, 256]
    assert all(len(set(g)) == len(g) and set(g) <= set(texts) for g in groups)
    assert groups == compose([1, 4, 32, 256], texts, seed=3) and groups != compose([1, 4, 32, 256], texts, 4)
    assert groups[2] != texts[:32]  # drawn at random, not the corpus in order
    with pytest.raises(ValueError):
        compose([256], texts[:100], seed=0)
    bodies = encode(Target("http://127.0.0.1:9/v1/embeddings", "m"), [["a"], ["b", "c"]])
    assert bodies.counts == (1, 2) and json.loads(bodies.bodies[0])["input"] == "a"
    assert json.loads(bodies.bodies[1])["input"] == ["b", "c"]


def test_how_an_arrival_ended() -> None:
    assert status(Arrival(1.0, sent=None)) == "unsent"
    assert status(Arrival(1.0, sent=1.0, done=1.1, ok=True)) == "200"
    assert status(Arrival(1.0, sent=1.0, done=None)) == "unanswered"
    assert status(Arrival(1.0, sent=1.0, done=1.1, problem="HTTP 503: b'busy'")) == "HTTP 503"
    assert status(Arrival(1.0, sent=1.0, done=1.1, problem="expected 32 embeddings: b'{}'")) == "bad body"
    assert status(Arrival(1.0, sent=1.0, done=1.1, problem="ServerDisconnectedError: gone")) == (
        "ServerDisconnectedError"
    )


def test_the_window_is_bounded() -> None:
    assert window_s(3.0, 15.0, 600) == 200.0  # 600 arrivals at 3 req/s
    assert window_s(0.5, 15.0, 10_000) == MAX_WINDOW_S  # never longer than 900 s
    assert window_s(3.0, 15.0, 0) == 15.0


TIMING = Timing(warmup_s=1.0, duration_s=10.0)


def _drive() -> tuple[Drive, list[int]]:
    """100 arrivals, one every 0.1 s from 1 s on (all in the window); sizes 1, 2, 3, 4, 32 repeating,
    with a 256 at 5 s. Small requests answered in 20 ms (every tenth in 100 ms), 32s in 200 ms, the 256
    in 1 s; two 32s fail (HTTP 503, a client error), one small one is unanswered, one unsent."""
    arrivals, sizes = [], []
    for i in range(100):
        t = 1.0 + i * 0.1
        n = 256 if i == 40 else [1, 2, 3, 4, 32][i % 5]
        latency = 1.0 if n == 256 else 0.2 if n == 32 else (0.1 if i % 10 == 0 else 0.02)
        a = Arrival(t, sent=t, done=t + latency, ok=True)
        if i in (4, 9):
            a.ok, a.problem = False, "HTTP 503: b'busy'" if i == 4 else "ClientOSError: reset"
        if i == 11:
            a.done = None
            a.ok = False
        if i == 12:
            a.sent = a.done = None
            a.ok = False
        arrivals.append(a)
        sizes.append(n)
    return Drive(arrivals, peak_in_flight=4), sizes


def test_per_class_summary_counts_latency_and_errors_by_status() -> None:
    result, sizes = _drive()
    p = summarize_mixed("svc", 10.0, result, sizes, TIMING, client_cpu=0.05)
    assert p.workload == "W4" and p.texts_per_request == 15 and p.setting["offered_req_per_s"] == 10.0
    classes = p.setting["classes"]
    assert {k: v["arrivals"] for k, v in classes.items()} == {"1-4": 79, "32": 20, "256": 1}
    small = classes["1-4"]
    assert small["errors"] == 2 and small["errors_by_status"] == {"unanswered": 1, "unsent": 1}
    assert small["p50_ms"] == pytest.approx(20.0) and small["p99_ms"] == pytest.approx(100.0)
    assert classes["32"]["errors_by_status"] == {"ClientOSError": 1, "HTTP 503": 1}
    assert classes["32"]["p50_ms"] == pytest.approx(200.0) and classes["256"]["p99_ms"] == pytest.approx(
        1000.0
    )
    assert p.errors == 4 and p.setting["errors_by_status"] == {
        "ClientOSError": 1,
        "HTTP 503": 1,
        "unanswered": 1,
        "unsent": 1,
    }
    # Offered: every text scheduled in the window; answered: the texts of the good answers received in it.
    offered = sum(sizes)
    assert p.setting["offered_texts_per_s"] == pytest.approx(offered / 10.0)
    lost = 32 + 32 + 2 + 3  # the failed requests (arrivals 4, 9, 11, 12)
    late = 32  # arrival 99, 32 texts scheduled at 10.9 s, answered at 11.1 s: after the window
    assert p.seq_per_s == pytest.approx((offered - lost - late) / 10.0)
    assert p.setting["texts_per_s"] == p.seq_per_s


def test_a_window_of_requests_of_every_size_against_a_local_server() -> None:
    """``measure`` end to end: the open-loop driver sends every size; the server refuses 32-text requests."""
    with _server() as url:
        texts = [f"sentence {i} of the corpus." for i in range(300)]
        point, problems = measure("fake", Target(url, "m"), texts, 40.0, Timing(0.3, 2.0, 10.0), 0, 500.0)
    classes = point.setting["classes"]
    assert classes["1-4"]["arrivals"] > 40 and classes["1-4"]["errors"] == 0
    assert classes["32"]["arrivals"] > 0 and classes["32"]["errors"] == classes["32"]["arrivals"]
    assert classes["32"]["errors_by_status"] == {"HTTP 503": classes["32"]["arrivals"]}
    assert classes["1-4"]["p99_ms"] is not None and problems and problems[0].startswith("HTTP 503")
    assert point.setting["sustained"] is False and point.setting["why"]  # a sixth of its requests failed


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = 1 if isinstance(body["input"], str) else len(body["input"])
        status, payload = (503, b"busy") if n == 32 else (200, _answer(n))
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def _answer(n: int) -> bytes:
    return json.dumps({"data": [{"embedding": [0.1, 0.2], "index": i} for i in range(n)]}).encode()


class _server:
    def __enter__(self) -> str:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/embeddings"

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
