"""The traffic users send, against the shipped config: bulk clients at the largest request the service
accepts, several at once, beside interactive single texts; a burst far beyond capacity; every route and
output type at the largest size, sparse and both rerank scoring paths included. Each case passes only
when every request got an answer and every answer is a 200, 429, 503 with Retry-After or 504 (tests/
integration/matrix.py). Sized to the default suite: short texts, one or two requests per client. The
sparse and cross-encoder cases run beside the demo models in test_retrieval_api.py."""

from __future__ import annotations

import asyncio

import httpx
import msgpack
import pytest

from tests.integration.conftest import CLASSIFIER
from tests.integration.matrix import (
    BULK_CLIENTS,
    LARGEST,
    Check,
    Outcome,
    fire,
    passes,
    rerank_body,
    rows,
    texts,
)

pytestmark = pytest.mark.integration


def test_bulk_clients_at_the_largest_request_beside_interactive_single_texts(base_url: str) -> None:
    async def scenario() -> tuple[Outcome, Outcome]:
        done = asyncio.Event()

        async def bulk() -> Outcome:
            try:
                return await fire(
                    f"{base_url}/v1/embeddings",
                    lambda: {"input": texts(LARGEST)},
                    BULK_CLIENTS,
                    per_client=2,
                    check=rows("data", LARGEST),
                )
            finally:
                done.set()

        async def interactive() -> Outcome:
            body = {"input": texts(1)[0]}
            return await fire(
                f"{base_url}/v1/embeddings",
                lambda: body | {"input": texts(1)[0]},
                2,
                400,
                check=rows("data", 1),
                until=done,
            )

        return await asyncio.gather(bulk(), interactive())

    bulk, interactive = asyncio.run(scenario())
    passes(bulk, BULK_CLIENTS * 2)
    assert not interactive.problems(), (dict(interactive.statuses), interactive.problems()[:5])
    assert interactive.ok() >= 2, dict(interactive.statuses)  # they kept being served beside the bulk


def test_a_burst_of_400_requests_at_once(base_url: str) -> None:
    outcome = asyncio.run(
        fire(
            f"{base_url}/v1/embeddings",
            lambda: {"input": texts(32, max_words=6)},
            400,
            check=rows("data", 32),
        )
    )
    # Far beyond capacity: refusals are allowed (503 + Retry-After, 504), answers outside them are not.
    passes(outcome, 400, min_ok=0.1)


def _msgpack_rows(count: int) -> Check:
    def check(resp: httpx.Response) -> str | None:
        if not resp.headers["content-type"].startswith("application/msgpack"):
            return f"content-type {resp.headers['content-type']}"
        got = len(msgpack.unpackb(resp.content)["data"])
        return None if got == count else f"{got} rows for {count} inputs"

    return check


# (path, body, headers, check): each sent by BULK_CLIENTS clients at once, at the largest request.
SESSION_CASES = {
    "embeddings-float": ("/v1/embeddings", lambda: {"input": texts(LARGEST)}, None, rows("data", LARGEST)),
    "embeddings-base64": (
        "/v1/embeddings",
        lambda: {"input": texts(LARGEST), "encoding_format": "base64"},
        None,
        rows("data", LARGEST),
    ),
    "embeddings-msgpack": (
        "/v1/embeddings",
        lambda: {"input": texts(LARGEST)},
        {"Accept": "application/msgpack"},
        _msgpack_rows(LARGEST),
    ),
    "cohere-embed-types": (
        "/v2/embed",
        lambda: {
            "texts": texts(LARGEST),
            "input_type": "search_document",
            "embedding_types": ["float", "int8", "uint8", "binary", "ubinary"],
        },
        None,
        lambda r: None if len(r.json()["embeddings"]["ubinary"]) == LARGEST else "ubinary rows missing",
    ),
    "rerank-cosine": ("/v1/rerank", lambda: rerank_body(LARGEST), None, rows("results", 10)),
    "rerank-tei": (
        "/rerank",
        lambda: {"query": "a query", "texts": texts(LARGEST), "return_text": True},
        None,
        rows("", LARGEST),
    ),
    "classify": (
        "/predict",
        lambda: {"model": CLASSIFIER, "texts": texts(LARGEST)},
        None,
        rows("predictions", LARGEST),
    ),
}


@pytest.mark.parametrize("case", SESSION_CASES)
def test_every_route_and_output_type_at_the_largest_request(base_url: str, case: str) -> None:
    path, body, headers, check = SESSION_CASES[case]
    outcome = asyncio.run(fire(base_url + path, body, BULK_CLIENTS, check=check, headers=headers))
    passes(outcome, BULK_CLIENTS)
