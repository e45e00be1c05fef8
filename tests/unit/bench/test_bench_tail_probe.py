import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bench.tail_probe import Answered, by_length, nearest_texts, one_client, slowest


def test_by_length_bins_by_token_count_and_leaves_empty_bins_out() -> None:
    answers = [Answered(10, 0.010), Answered(20, 0.030), Answered(200, 0.050)]
    lines = by_length(answers)
    assert len(lines) == 2
    assert lines[0].startswith("  tokens 0-31: n 2, p50 20.0") and lines[0].endswith("max 30.0 ms")
    assert lines[1].startswith("  tokens 128+: n 1, p50 50.0")


def test_slowest_takes_the_slowest_share_slowest_first_and_at_least_one() -> None:
    answers = [Answered(i, i / 1000) for i in range(1, 301)]
    top = slowest(answers)
    assert [a.tokens for a in top] == [300, 299, 298]
    assert slowest(answers[:5]) == [answers[4]]
    assert slowest([]) == []


def test_nearest_texts_takes_the_closest_count_and_the_first_of_ties() -> None:
    tokens = [12, 40, 38, 129, 250, 42]
    assert nearest_texts(tokens, [16, 40, 41, 128, 300]) == [0, 1, 1, 3, 4]


def test_one_client_sends_each_body_in_turn_and_fails_loudly_on_an_error() -> None:
    seen: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(body)
        return web.Response(status=400 if body == b"bad" else 200, text="{}")

    async def run(bodies: list[bytes]) -> list[list[float]]:
        app = web.Application()
        app.router.add_post("/v1/embeddings", handler)
        async with TestServer(app, host="127.0.0.1") as server:
            return await one_client(str(server.make_url("/v1/embeddings")), bodies, 0.0, repeats=2)

    runs = asyncio.run(run([b"a", b"b"]))
    assert [len(r) for r in runs] == [2, 2] and all(t > 0 for r in runs for t in r)
    assert seen == [b"a", b"b"] * 3  # one warm-up pass, then two counted
    with pytest.raises(RuntimeError, match="HTTP 400"):
        asyncio.run(run([b"bad"]))
