"""The sizes a client plans with: ``GET /v1/models`` lists them in every entry, each from its one source (the
router's LimitsConfig, the model's card), and every refusal for one of them names it, its value and the
body's field. The ingress's handlers run here with a stand-in for the deployment (no Ray)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI

from contracts.errors import PayloadTooLargeError, ServiceError, TooManyInputsError
from contracts.tokenized import TokenizeJob
from deployments.config import LimitsConfig
from deployments.ingress import retrieval
from deployments.ingress.errors import error_response, status_of
from deployments.ingress.limits import check_job_size, lane_limits
from deployments.ingress.routing import ModelRouter, Route
from deployments.ingress.server import Ingress
from deployments.pipeline.card import LaneCard, ModelCard
from preprocess.parsing import parse_body

INGRESS = Ingress.func_or_class  # the class behind Serve's deployment: its handlers as plain methods
LIMITS = LimitsConfig(max_inputs_per_request=3, max_body_bytes=4096)


def _lane(task: str, version: str = "1", max_tokens: int = 256, **extra: Any) -> LaneCard:
    return LaneCard(
        version=version,
        role="stable",
        share=1.0,
        task=task,
        max_tokens=max_tokens,
        dimension=384 if task in ("embed", "sparse_embed") else None,
        labels=("neg", "pos") if task == "classify" else (),
        **extra,
    )


# --- what GET /v1/models lists --------------------------------------------------------------------------


def test_an_embedding_model_lists_every_limit_a_client_plans_with():
    assert lane_limits(_lane("embed"), LimitsConfig()) == {
        "max_inputs_per_request": 256,
        "max_tokens_per_input": 256,
        "max_request_bytes": 2 * 1024 * 1024,
        "max_documents_per_rerank": 256,
        "truncation": "on_request",
    }


@pytest.mark.parametrize(
    ("task", "documents"), [("embed", True), ("rerank", True), ("classify", False), ("sparse_embed", False)]
)
def test_encoders_list_the_router_limits_and_their_own_token_limit(task, documents):
    limits = lane_limits(_lane(task, max_tokens=512), LIMITS)
    assert limits["max_inputs_per_request"] == 3 and limits["max_request_bytes"] == 4096
    assert limits["max_tokens_per_input"] == 512  # the card's, from the manifest's input.max_tokens
    assert ("max_documents_per_rerank" in limits) == documents  # only models that answer the rerank routes
    if documents:
        assert limits["max_documents_per_rerank"] == LIMITS.max_documents_per_rerank == 3


def test_a_generate_model_lists_its_context_not_per_input_limits():
    assert lane_limits(_lane("generate", max_tokens=1024, max_new_tokens=300), LIMITS) == {
        "max_context_tokens": 1024,
        "max_new_tokens": 300,
        "max_request_bytes": 4096,
        "truncation": "none",
    }


def _router() -> ModelRouter:
    router = ModelRouter(["embedder", "lm"], "embedder")
    candidate = LaneCard("2", "candidate", 0.25, "embed", 512, 384, ())
    router.update(ModelCard("embedder", (_lane("embed"), candidate)))
    router.update(ModelCard("lm", (_lane("generate", "7", max_tokens=1024),)))
    return router


def test_every_entry_by_name_and_by_version_carries_its_versions_limits():
    entries = {e["id"]: e for e in _router().entries(LIMITS)}
    assert list(entries) == ["embedder", "embedder:1", "embedder:2", "lm", "lm:7"]
    assert all(e["limits"]["max_request_bytes"] == 4096 for e in entries.values())
    # Each version's own token limit: a candidate with a longer one lists it under its name:version.
    assert [
        entries[i]["limits"]["max_tokens_per_input"] for i in ("embedder", "embedder:1", "embedder:2")
    ] == [
        256,
        256,
        512,
    ]
    assert entries["lm"]["limits"]["max_context_tokens"] == 1024
    assert entries["embedder"]["max_tokens"] == 256  # the older top-level field stays


class _Stand:
    """What the ingress's handlers use of the deployment, without Ray: its router and limits, its body
    reader and route checks (the real ones), and a ``_run`` that checks the request's size as the real one
    does and keeps the job."""

    def __init__(self, limits: LimitsConfig = LIMITS) -> None:
        self.router = _router()
        self.limits = limits
        self.jobs: list[TokenizeJob] = []

    _read_body = INGRESS._read_body

    async def parse_body(self, request: Any, schema: type) -> Any:
        return parse_body(await self._read_body(request), "application/json", schema)

    def route_for(self, model: str | None, path: str) -> Route:
        return self.router.route(model)

    def authorize(self, model: str) -> None:
        return None

    def response_options(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def run_encoder(self, request: Any, route: Route, job: TokenizeJob, options: Any) -> None:
        check_job_size(job, self.limits)
        self.jobs.append(job)


class _Request:
    """A request as the handlers read it: headers and a body that arrives in chunks."""

    def __init__(self, body: bytes, headers: dict[str, str] | None = None, chunk: int = 1000) -> None:
        self.headers = {"content-type": "application/json"} if headers is None else headers
        self._chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)]

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def test_the_listing_keeps_openais_shape_and_the_openai_client_reads_it():
    answer = asyncio.run(INGRESS.models(_Stand()))
    body = orjson.loads(answer.body)
    assert body["object"] == "list" and {e["object"] for e in body["data"]} == {"model"}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=answer.body))
    client = OpenAI(
        base_url="http://textserve/v1", api_key="x", http_client=httpx.Client(transport=transport)
    )
    models = client.models.list().data
    assert [m.id for m in models] == ["embedder", "embedder:1", "embedder:2", "lm", "lm:7"]
    assert models[0].limits["max_inputs_per_request"] == 3  # the extra fields survive in the client's model


# --- every limit refused with a 4xx that names it, its value and the field ------------------------------


def _refusal(coro: Any) -> tuple[ServiceError, dict[str, Any], int]:
    with pytest.raises(ServiceError) as info:
        asyncio.run(coro)
    answer = error_response(info.value)
    return info.value, orjson.loads(answer.body)["error"], status_of(info.value)


def _post(handler: Any, body: dict[str, Any], limits: LimitsConfig = LIMITS) -> Any:
    return handler(_Stand(limits), _Request(orjson.dumps(body)))


@pytest.mark.parametrize(
    ("handler", "body", "param", "what"),
    [
        (INGRESS.embeddings, {"input": ["a"] * 4}, "input", "inputs"),
        (INGRESS.embeddings, {"input": [[1037]] * 4}, "input", "inputs"),  # token ids count the same
        (INGRESS.predict, {"texts": ["a"] * 4}, "texts", "inputs"),
        (retrieval.cohere_embed, {"texts": ["a"] * 4}, "texts", "inputs"),
        (retrieval.embed_sparse, {"inputs": ["a"] * 4}, "inputs", "inputs"),
        (retrieval.tokenize, {"input": ["a"] * 4}, "input", "inputs"),
    ],
)
def test_too_many_inputs_is_a_400_naming_the_limit_and_the_field(handler, body, param, what):
    error, payload, status = _refusal(_post(handler, body))
    assert isinstance(error, TooManyInputsError) and status == 400
    assert payload["code"] == "too_many_inputs" and payload["param"] == param
    assert payload["message"] == (
        f"too many {what} in {param!r}: 4 given, over the limit of 3 per request (max_inputs_per_request)"
    )


@pytest.mark.parametrize(
    ("handler", "field"),
    [
        (lambda s, r: retrieval.rerank(s, r, "/v1/rerank"), "documents"),  # Cohere v2 / Jina
        (retrieval.rerank_tei, "texts"),  # TEI
    ],
)
def test_too_many_rerank_documents_is_a_400_naming_the_documents_limit(handler, field):
    stand = _Stand()
    asyncio.run(handler(stand, _Request(orjson.dumps({"query": "q", field: ["d"] * 3}))))
    assert stand.jobs[0].field == field  # at the limit: accepted, and a too-long document names this field
    _, payload, status = _refusal(handler(_Stand(), _Request(orjson.dumps({"query": "q", field: ["d"] * 4}))))
    assert status == 400 and payload["code"] == "too_many_inputs" and payload["param"] == field
    assert "too many documents" in payload["message"]
    assert "over the limit of 3 per request (max_documents_per_rerank)" in payload["message"]


@pytest.mark.parametrize(
    ("handler", "body", "field", "hint"),
    [
        (INGRESS.embeddings, {"input": "a"}, "input", '"truncate": true'),
        (INGRESS.predict, {"text": "a"}, "text", '"truncate": true'),
        (INGRESS.predict, {"texts": ["a"]}, "texts", '"truncate": true'),
        (retrieval.cohere_embed, {"texts": ["a"], "truncate": "NONE"}, "texts", '"truncate": "END"'),
        (retrieval.embed_sparse, {"inputs": "a"}, "inputs", '"truncate": true'),
    ],
)
def test_each_route_names_its_own_field_and_truncate_for_a_too_long_input(handler, body, field, hint):
    stand = _Stand()
    asyncio.run(handler(stand, _Request(orjson.dumps(body))))
    (job,) = stand.jobs
    assert (job.field, job.truncate_hint, job.truncate) == (field, hint, False)


def test_cohere_embed_truncates_by_default_as_cohere_does():
    stand = _Stand()
    asyncio.run(retrieval.cohere_embed(stand, _Request(orjson.dumps({"texts": ["a"]}))))
    assert stand.jobs[0].truncate  # truncate: END unless the request says NONE


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_over_the_byte_limit_is_a_413_naming_the_limit(declared):
    body = orjson.dumps({"input": "a" * 5000})
    headers = {"content-type": "application/json"}
    if declared:
        headers["content-length"] = str(len(body))
    stand = _Stand()
    error, payload, status = _refusal(INGRESS.embeddings(stand, _Request(body, headers)))
    assert isinstance(error, PayloadTooLargeError) and status == 413
    assert payload["code"] == "payload_too_large"
    assert payload["message"] == "request body is over the limit of 4096 bytes (max_request_bytes)"
    assert not stand.jobs


def test_a_body_at_the_byte_limit_is_read_whole():
    body = orjson.dumps({"input": "a" * (4096 - 12)})
    assert len(body) == 4096
    assert asyncio.run(_Stand()._read_body(_Request(body, {"content-length": "4096"}))) == body


def test_a_content_length_that_is_not_a_number_names_the_header():
    _, payload, status = _refusal(_Stand()._read_body(_Request(b"{}", {"content-length": "12x"})))
    assert status == 400 and payload["param"] == "content-length"
