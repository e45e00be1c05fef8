"""Bursts of the traffic users send, for the traffic matrix and the soak: many clients at once, each
answer checked against what the service promises under any load (an answer, 429, 503 with Retry-After or
504; never a 500, never a request left without an answer)."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from deployments.config import LimitsConfig

# What a client may get under any load: the answer, or a refusal it can retry.
ALLOWED = {200, 429, 503, 504}
LARGEST = LimitsConfig().max_inputs_per_request  # the most inputs one request may hold (256)
BULK_CLIENTS = 8  # a nightly job's clients, each sending the largest request
_PROSE = (
    "models encode text into dense vectors that capture meaning so similar sentences end up close "
    "together while unrelated ones stay apart serving them well means batching requests avoiding "
    "padding and keeping latency low under every load a production service meets at night and by day"
)
_WORDS = _PROSE.split(" ")
_serial = itertools.count()


def texts(n: int, min_words: int = 3, max_words: int = 12, seed: int | None = None) -> list[str]:
    """``n`` distinct texts of mixed lengths: distinct across calls too, so that no answer can come from
    the degraded-answer cache (a recent identical request's result). Short by default: what a call between
    replicas carries grows with the number of inputs, not their length; short texts keep the suite quick."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.choices(_WORDS, k=rng.randint(min_words, max_words))
        out.append(f"{next(_serial)} " + " ".join(words))
    return out


@dataclass
class Shot:
    """One request's outcome: its HTTP status (0: the client got no answer) and what was wrong with it."""

    status: int
    seconds: float
    problem: str | None = None


@dataclass
class Outcome:
    shots: list[Shot] = field(default_factory=list)

    @property
    def statuses(self) -> Counter[int]:
        return Counter(s.status for s in self.shots)

    def problems(self) -> list[str]:
        """Everything outside the promise: a status not in ALLOWED, no answer, a 503 without Retry-After,
        an error not in the service's JSON format, a 200 whose body is incomplete or degraded."""
        return [f"{s.status}: {s.problem}" for s in self.shots if s.problem is not None]

    def ok(self) -> int:
        return self.statuses[200]


Body = Callable[[], dict[str, Any]]
Check = Callable[[httpx.Response], str | None]  # a 200's body checked: None, or what is wrong


def _judge(resp: httpx.Response, check: Check | None) -> str | None:
    status = resp.status_code
    if status not in ALLOWED:
        return resp.text[:300]
    if status == 200:
        if resp.headers.get("x-degraded") == "true":
            return "a degraded answer (the model path failed)"
        return check(resp) if check is not None else None
    try:
        resp.json()["error"]["code"]
    except Exception:
        return f"not the service's error format: {resp.text[:200]!r}"
    if status == 503 and "retry-after" not in resp.headers:
        return "503 without Retry-After"
    return None


async def fire(
    url: str,
    body: Body,
    clients: int,
    per_client: int = 1,
    check: Check | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    until: asyncio.Event | None = None,
) -> Outcome:
    """``clients`` concurrent clients, each sending ``per_client`` requests back to back (or, with
    ``until``, until it is set: at most ``per_client`` all the same). Bounded in count and time."""
    outcome = Outcome()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, headers=headers) as client:

        async def one_client() -> None:
            for _ in range(per_client):
                if until is not None and until.is_set():
                    return
                start = time.monotonic()
                try:
                    resp = await client.post(url, json=body())
                except httpx.HTTPError as exc:
                    outcome.shots.append(Shot(0, time.monotonic() - start, f"no answer: {exc!r}"))
                    continue
                problem = _judge(resp, check)
                outcome.shots.append(Shot(resp.status_code, time.monotonic() - start, problem))

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return outcome


def rows(key: str, count: int) -> Check:
    """A 200 whose ``key`` list (``data``, ``results``, ...) holds ``count`` entries; a JSON list body
    when ``key`` is empty."""

    def check(resp: httpx.Response) -> str | None:
        body = resp.json()
        got = len(body if not key else body[key])
        return None if got == count else f"{got} {key or 'rows'} for {count} inputs"

    return check


def passes(outcome: Outcome, sent: int, min_ok: float = 0.5) -> None:
    """Every request answered, every answer within the promise, and most of them served."""
    assert len(outcome.shots) == sent, f"{sent - len(outcome.shots)} requests got no outcome"
    assert not outcome.problems(), (dict(outcome.statuses), outcome.problems()[:5])
    assert outcome.ok() >= min_ok * sent, dict(outcome.statuses)


def rerank_body(documents: int) -> dict[str, Any]:
    return {"query": texts(1)[0], "documents": texts(documents), "top_n": 10, "return_documents": True}
