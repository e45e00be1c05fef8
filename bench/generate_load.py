"""HTTP load for ``python -m bench.generate``: a prompt mix, streamed chat completions, closed and open loop.

Every request is ``POST /v1/chat/completions`` with ``stream: true`` (``stream_options.include_usage``),
greedy (``temperature: 0``), one user message from the prompt mix and its own ``max_tokens``. The answer
is read as server-sent events line by line (``StreamRecord.feed``): the time of the first and the last
content chunk, the number of content chunks, the longest gap between two of them, and the final
``usage``. A server may put several tokens into one chunk, so the output token count comes from
``usage.completion_tokens`` (the content chunks only where no usage came back, counted apart), and the
inter-token latency of a request is ``(last chunk - first chunk) / (completion_tokens - 1)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from bench.openloop import drive, pick_bodies, poisson_schedule

CANCELLED_AT_END = "cancelled at the end of the window"
WINDOW_LIVES = 3  # a closed-loop window holds at least this many lives of its slowest first answer...
MAX_WINDOW_S = 120.0  # ...up to this long


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int
    prompt_tokens: int | None = None  # by the model's tokenizer, without the chat template
    system: str | None = None  # a system message before the user's (the shared-prefix workload)


def prompt_mix(
    texts: Sequence[str],
    n: int,
    seed: int,
    max_tokens: tuple[int, int] = (32, 128),
    count_tokens: Callable[[str], int] | None = None,
    prompt_tokens: tuple[int, int] = (10, 300),
    join: tuple[int, int] = (1, 3),
) -> list[Prompt]:
    """``n`` prompts, each 1-3 corpus texts joined (drawn with a generator seeded with ``seed``), with a
    ``max_tokens`` drawn uniformly from ``max_tokens``. With ``count_tokens``, prompts outside
    ``prompt_tokens`` are drawn again. The same arguments give the same prompts."""
    if not texts:
        raise ValueError("no texts for the prompt mix")
    rng = random.Random(seed)
    out: list[Prompt] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 100:
            raise ValueError(f"only {len(out)} of {n} prompts fit {prompt_tokens} tokens")
        k = rng.randint(*join)
        text = " ".join(texts[rng.randrange(len(texts))] for _ in range(k))
        budget = rng.randint(*max_tokens)
        tokens = count_tokens(text) if count_tokens else None
        if tokens is not None and not prompt_tokens[0] <= tokens <= prompt_tokens[1]:
            continue
        out.append(Prompt(text, budget, tokens))
    return out


def messages(prompt: Prompt) -> list[dict[str, str]]:
    """The chat messages of a prompt: its ``system`` text (if any) as a system message, then the user's."""
    out = [{"role": "user", "content": prompt.text}]
    if prompt.system is not None:
        out.insert(0, {"role": "system", "content": prompt.system})
    return out


def chat_body(prompt: Prompt, model: str | None, stream: bool = True) -> bytes:
    """The request body; ``model`` None leaves the field out (a server pinned to one model)."""
    body: dict[str, object] = {
        "messages": messages(prompt),
        "max_tokens": prompt.max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if model:
        body["model"] = model
    return json.dumps(body).encode()


@dataclass
class StreamRecord:
    """One streamed request, times from ``time.monotonic()``."""

    sent: float
    prompt: int = -1  # index into the prompt mix
    first: float | None = None  # first content chunk
    last: float | None = None  # last content chunk
    chunks: int = 0  # content chunks
    max_gap: float = 0.0  # longest gap between two content chunks
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    done_marker: bool = False  # ``data: [DONE]`` seen
    ended: float | None = None  # the stream closed
    error: str | None = None
    keep_text: bool = False
    text: list[str] = field(default_factory=list)

    def feed(self, line: bytes | str, now: float) -> None:
        """One line of the event stream (``data: {...}``; other SSE lines are ignored)."""
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        line = line.strip()
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done_marker = True
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            self.error = self.error or f"not JSON: {data[:120]}"
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.error = self.error or f"stream error: {str(event['error'])[:200]}"
            return
        usage = event.get("usage")
        if isinstance(usage, dict):
            if usage.get("completion_tokens") is not None:
                self.completion_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                self.prompt_tokens = int(usage["prompt_tokens"])
        for choice in event.get("choices") or []:
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if content:
                if self.last is not None:
                    self.max_gap = max(self.max_gap, now - self.last)
                if self.first is None:
                    self.first = now
                self.last = now
                self.chunks += 1
                if self.keep_text:
                    self.text.append(content)

    @property
    def ok(self) -> bool:
        return (
            self.error is None and self.ended is not None and (self.done_marker or bool(self.finish_reason))
        )

    @property
    def usage_missing(self) -> bool:
        return self.completion_tokens is None

    @property
    def tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.chunks

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    def tokens_in(self, lo: float, hi: float) -> float:
        """The tokens streamed inside ``[lo, hi]``: ``tokens`` spread evenly from the first to the last
        content chunk (a stream cut at a window's end: its content chunks); one chunk: where it fell."""
        if self.first is None or self.last is None:
            return 0.0
        if self.last <= self.first:
            return float(self.tokens) if lo <= self.first <= hi else 0.0
        return self.tokens * max(0.0, min(hi, self.last) - max(lo, self.first)) / (self.last - self.first)

    @property
    def itl(self) -> float | None:
        """Mean inter-token latency: first to last content chunk over the tokens between them (None for
        an answer in one content chunk: a server that does not stream has no inter-token latency)."""
        if self.first is None or self.last is None or self.tokens < 2 or self.chunks < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1)


async def stream_one(
    session: aiohttp.ClientSession, url: str, body: bytes, record: StreamRecord
) -> StreamRecord:
    """Send one request and read its event stream into ``record`` (errors go to ``record.error``)."""
    try:
        async with session.post(url, data=body) as resp:
            if resp.status != 200:
                text = await resp.read()
                record.error = f"HTTP {resp.status}: {text[:200]!r}"
            else:
                async for line in resp.content:
                    record.feed(line, time.monotonic())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        record.error = record.error or f"{type(exc).__name__}: {exc}"
    record.ended = time.monotonic()
    if record.error is None and not (record.done_marker or record.finish_reason):
        record.error = "stream ended without a finish reason or [DONE]"
    return record


def _session(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, headers={"Content-Type": "application/json"}
    )


@dataclass
class LoopResult:
    records: list[StreamRecord]
    window: tuple[float, float]  # monotonic start and end of the measured window
    client_cpu: float  # load generator CPU over the whole run, share of one core


async def closed_loop(
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    timeout_s: float,
    offset: int = 0,
) -> LoopResult:
    """``concurrency`` clients, each sending its next request when the last one ended, until the window
    ends; requests still out then are cancelled (the connection closes) and marked so. The window opens
    after ``warmup_s`` and once every client has had its first answer (or ``timeout_s`` later at most): a
    level whose answers outlast the warm-up would otherwise measure the first wave's prefill and no steady
    state, and no request sent inside the window would finish in it. It lasts ``duration_s``, or
    ``WINDOW_LIVES`` times the slowest first answer where that is longer (at most ``MAX_WINDOW_S``): with a
    fixed ``max_tokens`` a level's clients move in waves, and a window of one wave measures its phase (all
    prefill, or all decode), not the level."""
    start = time.monotonic()
    window = (start + warmup_s, start + warmup_s + duration_s)
    records: list[StreamRecord] = []
    counter = iter(range(offset, offset + 10**9))
    cpu0 = time.process_time()
    warm = asyncio.Event()
    first_done = 0
    longest_first = 0.0  # the slowest first answer's life, sent to stream end
    async with _session(concurrency, timeout_s) as session:

        async def client() -> None:
            nonlocal first_done, longest_first
            while time.monotonic() < window[1] or not warm.is_set():
                i = next(counter) % len(bodies)
                record = StreamRecord(sent=time.monotonic(), prompt=i)
                records.append(record)
                try:
                    await stream_one(session, url, bodies[i], record)
                except asyncio.CancelledError:
                    record.error, record.ended = CANCELLED_AT_END, time.monotonic()
                    raise
                if first_done < concurrency:
                    first_done += 1
                    longest_first = max(longest_first, record.ended - record.sent)
                    if first_done == concurrency:
                        warm.set()
                if record.error and record.ended - record.sent < 0.01:
                    await asyncio.sleep(0.05)  # a server failing fast must not become a busy loop

        tasks = [asyncio.create_task(client()) for _ in range(concurrency)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(warm.wait(), timeout_s)
        warm.set()
        length = max(duration_s, min(MAX_WINDOW_S, WINDOW_LIVES * longest_first))
        opens = max(window[0], time.monotonic())
        window = (opens, opens + length)
        await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    span = max(1e-9, time.monotonic() - start)
    return LoopResult(records, window, (time.process_time() - cpu0) / span)


@dataclass
class OpenLoopResult(LoopResult):
    lateness: list[float] = field(default_factory=list)  # per arrival: sent - scheduled (inf: unsent)
    peak_in_flight: int = 0


async def open_loop(
    url: str,
    bodies: Sequence[bytes],
    rate: float,
    warmup_s: float,
    duration_s: float,
    timeout_s: float,
    seed: int,
    offset: int | None = None,
) -> OpenLoopResult:
    """Poisson arrivals at ``rate`` req/s (``bench.openloop``'s schedule and driver); each arrival's
    record has ``sent`` moved back to its scheduled time, so TTFT counts any lateness of the client.
    Answers still out ``drain`` seconds after the last arrival are cancelled (unfinished). The bodies
    are drawn at random (seeded), or with ``offset`` in turn from there (each once, while they last)."""
    span = warmup_s + duration_s
    schedule = poisson_schedule(rate, span, seed + int(rate * 1000))
    if offset is None:
        picks = pick_bodies(len(schedule), len(bodies), seed + int(rate * 1000))
    else:
        picks = [(offset + i) % len(bodies) for i in range(len(schedule))]
    records = [StreamRecord(sent=0.0, prompt=picks[i]) for i in range(len(schedule))]
    drain = min(timeout_s, max(5.0, duration_s))
    cpu0 = time.process_time()
    async with _session(1024, timeout_s) as session:

        async def send(i: int) -> tuple[bool, str]:
            record = records[i]
            record.sent = time.monotonic()
            try:
                await stream_one(session, url, bodies[picks[i]], record)
            except asyncio.CancelledError:
                record.error, record.ended = CANCELLED_AT_END, time.monotonic()
                raise
            return record.ok, record.error or ""

        start = time.monotonic()
        result = await drive(schedule, send, drain)
    lateness = []
    for arrival, record in zip(result.arrivals, records, strict=True):
        record.sent = start + arrival.scheduled  # latency runs from the scheduled time
        if arrival.sent is None:
            record.error = "unsent: in-flight bound"
            lateness.append(float("inf"))
        else:
            lateness.append(max(0.0, arrival.sent - arrival.scheduled))
    window = (start + warmup_s, start + span)
    cpu = (time.process_time() - cpu0) / max(1e-9, time.monotonic() - start)
    return OpenLoopResult(records, window, cpu, lateness, result.peak_in_flight)


async def check_requests(url: str, bodies: Sequence[bytes], timeout_s: float) -> list[StreamRecord]:
    """The given requests one after the other, text kept (the output check)."""
    out = []
    async with _session(1, timeout_s) as session:
        for i, body in enumerate(bodies):
            record = StreamRecord(sent=time.monotonic(), prompt=i, keep_text=True)
            out.append(await stream_one(session, url, body, record))
    return out
