"""Long runs (``-m slow``): sustained overload, and a soak that watches the model replica's memory.

- Overload: 64 clients send list requests for 60 s against an ingress lowered to ``max_in_flight: 8``.
  Every request gets an answer, and the only answers are 200 and 503 ``overloaded`` + ``Retry-After``; the
  service is healthy afterwards. Counts and p50/p99 latencies are printed.
- Soak: ``SOAK_SECONDS`` (default 240) of traffic whose requests vary from 1 to 64 texts of varying length,
  while the Inference replica's RSS is sampled every few seconds (psutil, pid from the replica itself).
  After a warm-up, the median RSS of the last third of the samples must not exceed the first third's by
  15 % or more *and* by 50 MB or more (either bound passing is enough). The series is printed.
- The mixed-size soak: ``test_soak_mixed.py``.

Run: ``.venv/bin/python -m pytest -m slow tests/integration/test_soak.py -s``
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import psutil
import pytest

from tests.integration.replica_memory import (
    CLIENT_TIMEOUT_S,
    MB,
    RSS_GROWTH_BYTES,
    RSS_GROWTH_RATIO,
    RssSampler,
    growth,
    inference_pid,
    inference_stats,
    ingress_pid,
    percentile,
    rss_summary,
)
from tests.integration.traffic import error_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERLOAD_CLIENTS = 64
OVERLOAD_S = 60.0
OVERLOAD_MAX_IN_FLIGHT = 8
OVERLOAD_MAX_REQUESTS = 200_000
SOAK_S = float(os.environ.get("SOAK_SECONDS", "240"))
SOAK_CLIENTS = 4
SOAK_MAX_REQUESTS = 1_000_000
LEAK_REQUESTS = 150
DISCONNECT_MAX_IN_FLIGHT = 4
DISCONNECT_REQUESTS = 24
LEAK_SLACK_BYTES = 1 * MB + 50 * MB  # the cache's own size plus allocator slack

WORDS = [
    *("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "service", "model", "batch", "token"),
    *("text", "vector", "search", "query", "answer", "river", "mountain", "city", "music", "light", "water"),
    *("green", "house", "paper", "market", "garden", "energy", "table", "window", "story"),
]


@dataclass(frozen=True)
class Result:
    status: int | None  # None: no HTTP answer (timeout, connection error)
    latency_s: float
    code: str | None = None
    retry_after: str | None = None
    exc: str | None = None


def _run_load(
    base_url: str,
    clients: int,
    duration_s: float,
    make_body: Callable[[random.Random, int, int], dict[str, Any]],
    max_requests: int,
    backoff_on_503_s: float = 0.0,
) -> list[Result]:
    """A closed loop of ``clients`` concurrent clients for ``duration_s`` (and at most ``max_requests``)."""
    results: list[Result] = []
    stop_at = time.monotonic() + duration_s

    async def main() -> None:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=base_url, timeout=CLIENT_TIMEOUT_S, limits=limits) as client:

            async def worker(w: int) -> None:
                rng = random.Random(w)
                i = 0
                while time.monotonic() < stop_at and len(results) < max_requests:
                    body = make_body(rng, w, i)
                    i += 1
                    started = time.monotonic()
                    try:
                        resp = await client.post("/v1/embeddings", json=body)
                    except httpx.HTTPError as exc:
                        results.append(Result(None, time.monotonic() - started, exc=repr(exc)))
                        continue
                    latency = time.monotonic() - started
                    code = error_code(resp)
                    results.append(Result(resp.status_code, latency, code, resp.headers.get("retry-after")))
                    if resp.status_code == 503 and backoff_on_503_s:
                        await asyncio.sleep(rng.uniform(0, backoff_on_503_s))

            await asyncio.gather(*(worker(w) for w in range(clients)))

    asyncio.run(asyncio.wait_for(main(), duration_s + CLIENT_TIMEOUT_S + 30))
    return results


def _text(rng: random.Random, words: int, tag: str) -> str:
    return f"{tag} " + " ".join(rng.choice(WORDS) for _ in range(words))


def test_sustained_overload_gets_only_200_or_503_and_recovers(http, base_url, ingress_config):
    ingress_config(max_in_flight=OVERLOAD_MAX_IN_FLIGHT)

    def body(rng: random.Random, w: int, i: int) -> dict[str, Any]:
        return {"input": [_text(rng, rng.randint(5, 40), f"c{w}r{i}k{k}") for k in range(32)]}

    started = time.monotonic()
    # Clients retry a refusal after a short random pause (0-50 ms), far more eagerly than Retry-After asks.
    results = _run_load(base_url, OVERLOAD_CLIENTS, OVERLOAD_S, body, OVERLOAD_MAX_REQUESTS, 0.05)
    elapsed = time.monotonic() - started

    counts = Counter(r.status for r in results)
    ok = [r.latency_s for r in results if r.status == 200]
    refused = [r for r in results if r.status == 503]
    all_latencies = [r.latency_s for r in results]
    print(
        f"\noverload ({OVERLOAD_CLIENTS} clients, max_in_flight={OVERLOAD_MAX_IN_FLIGHT}, {elapsed:.0f} s): "
        f"{len(results)} requests, status counts {dict(sorted(counts.items(), key=str))}, "
        f"served {len(ok) / elapsed:.1f} req/s ({len(ok) * 32 / elapsed:.0f} texts/s); "
        f"latency 200 p50 {percentile(ok, 50) * 1000:.0f} ms p99 {percentile(ok, 99) * 1000:.0f} ms; "
        f"503 p50 {percentile([r.latency_s for r in refused], 50) * 1000:.0f} ms "
        f"p99 {percentile([r.latency_s for r in refused], 99) * 1000:.0f} ms; "
        f"all p99 {percentile(all_latencies, 99) * 1000:.0f} ms"
    )

    assert not [r for r in results if r.status is None], "requests without an HTTP answer"
    assert set(counts) <= {200, 503}, counts
    assert len(ok) >= 50 and refused, counts  # served steadily, and the excess was refused
    for r in refused:
        assert r.code == "overloaded" and r.retry_after == "1", r
    # Refused at the door, not after queueing: a refusal is quicker than a served request. (Relative, not an
    # absolute bound: on a shared 2-core machine, absolute latencies follow the neighbours' load.)
    assert percentile([r.latency_s for r in refused], 50) < percentile(ok, 50)
    assert max(all_latencies) < CLIENT_TIMEOUT_S
    # Healthy afterwards, still under the lowered limit.
    assert http.get("/healthz").status_code == 200
    resp = http.post("/v1/embeddings", json={"input": ["after the overload", "still fine"]})
    assert resp.status_code == 200, resp.text


def test_soak_memory_of_the_model_replica_does_not_keep_growing(http, base_url):
    assert SOAK_S >= 45, "SOAK_SECONDS must be at least 45 (warm-up plus enough samples)"
    pid = inference_pid()
    pids = {"Inference": pid, "Ingress": ingress_pid()}
    interval_s = max(1.0, min(5.0, SOAK_S / 48))
    warmup_s = max(20.0, 0.15 * SOAK_S)

    def body(rng: random.Random, w: int, i: int) -> dict[str, Any]:
        n = rng.choice([1, 1, 2, 4, 8, 16, 32, 64, rng.randint(1, 64)])
        long_ones = rng.random() < 0.1  # some over the limit, cut by truncate
        texts = [
            _text(rng, rng.randint(250, 400) if long_ones else rng.randint(1, 200), f"w{w}r{i}k{k}")
            for k in range(n)
        ]
        return {"input": texts, "truncate": long_ones}

    started = time.monotonic()
    with RssSampler(pids, interval_s, max_samples=int(SOAK_S / interval_s) + 10) as sampler:
        results = _run_load(base_url, SOAK_CLIENTS, SOAK_S, body, SOAK_MAX_REQUESTS)
    elapsed = time.monotonic() - started

    counts = Counter(r.status for r in results)
    latencies = [r.latency_s for r in results]
    print(
        f"\nsoak ({elapsed:.0f} s, {SOAK_CLIENTS} clients, 1-64 texts per request): {len(results)} requests, "
        f"status counts {dict(counts)}, latency p50 {percentile(latencies, 50) * 1000:.0f} ms "
        f"p99 {percentile(latencies, 99) * 1000:.0f} ms"
    )
    for name, series in sampler.samples.items():
        print(rss_summary(name, series, warmup_s))

    assert set(counts) == {200}, (counts, [r for r in results if r.status != 200][:5])
    assert inference_pid() == pid, "the Inference replica restarted during the soak"
    grew, ratio, _, _ = growth(sampler.samples["Inference"], warmup_s)
    assert grew < RSS_GROWTH_BYTES or ratio < RSS_GROWTH_RATIO, (
        f"Inference RSS kept growing: {grew / MB:+.1f} MB ({ratio * 100:+.1f} %)"
    )
    assert http.get("/healthz").status_code == 200


class CacheOverBudget(AssertionError):
    pass


def test_fallback_cache_memory_stays_within_its_setting(http, base_url, ingress_config):
    """Long unique inputs, tiny answers (ubinary, 48 bytes): the ingress keeps no more than its cache."""
    ingress_config(fallback_cache_mb=1)  # a new, empty 1 MiB cache
    pid = ingress_pid()
    proc = psutil.Process(pid)
    filler = "word " * 200_000  # 1 MB of input text, cut to the token limit by truncate

    def body(rng: random.Random, w: int, i: int) -> dict[str, Any]:
        return {"input": f"client {w} request {i} {filler}", "truncate": True, "embedding_types": ["ubinary"]}

    # Warm the ingress on the same shape first, so allocator growth from the traffic itself is not counted.
    warm = _run_load(base_url, 2, 60, body, 10)
    assert {r.status for r in warm} == {200}, Counter(r.status for r in warm)
    before = proc.memory_info().rss
    results = _run_load(base_url, 2, 120, body, LEAK_REQUESTS)
    after = proc.memory_info().rss
    assert ingress_pid() == pid
    counts = Counter(r.status for r in results)
    print(
        f"\nfallback cache of 1 MiB, {len(results)} requests of 1 MB input with 1-float answers: "
        f"Ingress RSS {before / MB:.0f} MB -> {after / MB:.0f} MB ({(after - before) / MB:+.0f} MB)"
    )
    assert set(counts) == {200}, counts
    assert len(results) >= LEAK_REQUESTS // 2, "too few requests to judge"
    if after - before >= LEAK_SLACK_BYTES:
        raise CacheOverBudget(f"Ingress RSS grew {(after - before) / MB:.0f} MB with a 1 MiB fallback cache")


def test_client_disconnects_do_not_leak_admission_slots(http, base_url, ingress_config):
    """Clients that hang up mid-request must give their ``max_in_flight`` slot back (no permanent 503s)."""
    ingress_config(max_in_flight=DISCONNECT_MAX_IN_FLIGHT)
    before = inference_stats()
    heavy = {"input": [f"abandoned request text {k} " + "word " * 150 for k in range(64)]}

    def hang_up(_: int) -> str:
        try:
            with httpx.Client(base_url=base_url, timeout=0.3) as client:
                return str(client.post("/v1/embeddings", json=heavy).status_code)
        except httpx.TimeoutException:
            return "disconnected"

    with ThreadPoolExecutor(DISCONNECT_MAX_IN_FLIGHT * 2) as pool:
        outcomes = Counter(pool.map(hang_up, range(DISCONNECT_REQUESTS)))
    assert outcomes["disconnected"] >= DISCONNECT_MAX_IN_FLIGHT, outcomes  # slots were actually taken

    def probe(i: int) -> int:
        return http.post("/v1/embeddings", json={"input": f"probe {i}"}).status_code

    # A full house of concurrent requests must be admitted again; a leaked slot would 503 one forever.
    deadline = time.monotonic() + 60
    rounds = []
    while time.monotonic() < deadline:
        with ThreadPoolExecutor(DISCONNECT_MAX_IN_FLIGHT) as pool:
            codes = sorted(pool.map(probe, range(DISCONNECT_MAX_IN_FLIGHT)))
        rounds.append(codes)
        if codes == [200] * DISCONNECT_MAX_IN_FLIGHT:
            break
        time.sleep(1)
    after = inference_stats()
    ran = after["sequences"] - before["sequences"] - sum(len(r) for r in rounds)
    print(
        f"\ndisconnects: {dict(outcomes)}; probe rounds until all {DISCONNECT_MAX_IN_FLIGHT} admitted: "
        f"{len(rounds)} {rounds[-3:]}; abandoned sequences still run by the model: {ran} of "
        f"{outcomes['disconnected'] * len(heavy['input'])}"
    )
    assert rounds[-1] == [200] * DISCONNECT_MAX_IN_FLIGHT, rounds
