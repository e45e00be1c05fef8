"""Which open-loop requests make the tail: latency by the text's token count, and the slowest 1 %.

    .venv/bin/python -m bench.tail_probe --url http://127.0.0.1:8000/v1/embeddings --rates 30,60
    .venv/bin/python -m bench.tail_probe --url http://127.0.0.1:7997/embeddings --rates 30,60   # Infinity
    .venv/bin/python -m bench.tail_probe --url ... --one-client-pause-ms 100   # by length, one at a time

Against a server that is already running (start it yourself: ``serve run serve_config.yaml``, or Infinity
as bench/infinity.py starts it). Single corpus texts arrive as a Poisson process (``bench.openloop``'s
schedule and picks), latency runs from the scheduled time to the answer, and each answer is kept with its
text's token count. If the slowest 1 % are the longest texts, the tail is the model's own pass; if they hold
short texts too, it is something a request met on its way (docs/architecture.md: "the tail was the long
path"). ``--one-client-pause-ms``: instead, one client sends corpus texts of a few lengths in turn, each after
that pause, so that no two requests overlap: what a text of each length costs alone, to set beside what it
costs under load. Loopback only, bounded by ``--seconds`` per rate (``--repeats`` per length).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.openloop import drive, pick_bodies, poisson_schedule
from bench.results import percentile
from deployments.tools.corpus import build_corpus

BINS = (0, 32, 64, 128)  # token-count bins' lower edges; the last bin is open above
WARM_UP_S = 3.0  # arrivals before this are sent but not counted


@dataclass(frozen=True, slots=True)
class Answered:
    tokens: int
    latency_s: float


def by_length(answers: Sequence[Answered], bins: Sequence[int] = BINS) -> list[str]:
    """One line per token-count bin: count, p50, p90 and max latency (ms); empty bins are left out."""
    lines = []
    edges = [*bins, None]
    for lo, hi in itertools.pairwise(edges):
        sel = sorted(a.latency_s for a in answers if a.tokens >= lo and (hi is None or a.tokens < hi))
        if sel:
            span = f"{lo}-{hi - 1}" if hi is not None else f"{lo}+"
            lines.append(
                f"  tokens {span}: n {len(sel)}, p50 {percentile(sel, 50) * 1e3:.1f}, "
                f"p90 {percentile(sel, 90) * 1e3:.1f}, max {sel[-1] * 1e3:.1f} ms"
            )
    return lines


def slowest(answers: Sequence[Answered], share: float = 0.01) -> list[Answered]:
    """The slowest ``share`` of the answers (at least one), slowest first."""
    if not answers:
        return []
    return sorted(answers, key=lambda a: -a.latency_s)[: max(1, int(len(answers) * share))]


async def probe(
    url: str, model: str, rate: float, seconds: float, texts: list[str], tokens: list[int]
) -> list[Answered]:
    bodies = [json.dumps({"input": t, "model": model}).encode() for t in texts]
    schedule = poisson_schedule(rate, seconds + WARM_UP_S, seed=int(rate * 1000))
    picks = pick_bodies(len(schedule), len(bodies), seed=int(rate))
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as session:

        async def send(i: int) -> tuple[bool, str]:
            try:
                async with session.post(url, data=bodies[picks[i]]) as resp:
                    await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                return False, f"{type(exc).__name__}: {exc}"
            return resp.status == 200, "" if resp.status == 200 else f"HTTP {resp.status}"

        result = await drive(schedule, send, drain_s=10.0)
    if result.problems:
        print(f"  failed requests, e.g. {result.problems[0]}")
    return [
        Answered(tokens[picks[i]], a.done - a.scheduled)
        for i, a in enumerate(result.arrivals)
        if a.scheduled >= WARM_UP_S and a.ok and a.done is not None
    ]


def nearest_texts(tokens: Sequence[int], wanted: Sequence[int]) -> list[int]:
    """For each wanted token count, the index of the first text whose count is closest to it."""
    return [min(range(len(tokens)), key=lambda i: abs(tokens[i] - w)) for w in wanted]


async def one_client(url: str, bodies: Sequence[bytes], pause_s: float, repeats: int) -> list[list[float]]:
    """Each body in turn, ``repeats`` times, after ``pause_s`` of quiet each: latencies (s) per body."""
    out: list[list[float]] = [[] for _ in bodies]
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as session:
        for n in range(repeats + 1):  # the first pass warms up and is not counted
            for i, body in enumerate(bodies):
                await asyncio.sleep(pause_s)
                start = loop.time()
                async with session.post(url, data=body) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"HTTP {resp.status} from {url}")
                if n:
                    out[i].append(loop.time() - start)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tail_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--rates", default="30,60", help="req/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=40.0, help="measured per rate (after 3 s warm-up)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: all-MiniLM-L6-v2's")
    parser.add_argument("--one-client-pause-ms", type=float, default=None, help="one client instead")
    parser.add_argument("--lengths", default="16,40,80,128,180,230", help="token counts, one client")
    parser.add_argument("--repeats", type=int, default=50, help="requests per length, one client")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from bench.naive_server import default_model_dir

    texts = list(build_corpus().texts)
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer or default_model_dir()))
    tokens = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    if args.one_client_pause_ms is not None:
        picked = nearest_texts(tokens, [int(n) for n in args.lengths.split(",")])
        bodies = [json.dumps({"input": texts[i], "model": args.model}).encode() for i in picked]
        runs = asyncio.run(one_client(args.url, bodies, args.one_client_pause_ms / 1e3, args.repeats))
        print(f"one client, {args.one_client_pause_ms:g} ms between requests, {args.repeats} per length:")
        for i, lat in zip(picked, runs, strict=True):
            lat.sort()
            print(
                f"  {tokens[i]:4d} tokens: p50 {percentile(lat, 50) * 1e3:.1f}, "
                f"p90 {percentile(lat, 90) * 1e3:.1f}, min {lat[0] * 1e3:.1f} ms"
            )
        return
    for rate in (float(r) for r in args.rates.split(",")):
        answers = asyncio.run(probe(args.url, args.model, rate, args.seconds, texts, tokens))
        if not answers:
            print(f"{rate:g} req/s: no answers")
            continue
        lat = sorted(a.latency_s for a in answers)
        print(
            f"{rate:g} req/s: n {len(lat)}, p50 {percentile(lat, 50) * 1e3:.1f}, "
            f"p90 {percentile(lat, 90) * 1e3:.1f}, p99 {percentile(lat, 99) * 1e3:.1f} ms"
        )
        print("\n".join(by_length(answers)))
        top = slowest(answers)
        print(
            f"  slowest 1 %: tokens {[a.tokens for a in top]}, ms {[round(a.latency_s * 1e3) for a in top]}"
        )


if __name__ == "__main__":
    main()
