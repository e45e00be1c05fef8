"""The retrieval routes of the ingress: Cohere's embed, rerank (Cohere v2 / Jina and TEI's shape), TEI's
sparse embeddings and ``/tokenize``. Each parses its body, checks the model's task and options against
its card, builds the request's ``TokenizeJob`` and ``ResponseOptions``, and hands them to the ingress's
one request path (``IngressPath.run_encoder``): the same admission, deadline, tracing, errors and metrics as
``/v1/embeddings``.
"""

# No `from __future__ import annotations`: FastAPI must see real annotations (Request) on the methods.
import asyncio
import time

from fastapi import Request
from starlette.responses import Response

from contracts.errors import DeadlineExceededError, ServiceError
from contracts.outputs import RerankOptions
from contracts.tokenized import TokenizeJob
from deployments.ingress.path import IngressPath
from deployments.pipeline.card import MODEL
from deployments.pipeline.remote_errors import as_service_error
from postprocess.payloads import tokenize_payload
from postprocess.render import negotiate_media_type, render
from preprocess.parsing import (
    TIMEOUT_HEADER,
    check_dimensions,
    check_embedding_types,
    check_input_count,
    request_timeout,
)
from preprocess.prompts import rerank_job, resolve_prompt
from preprocess.schemas import (
    CohereEmbedRequest,
    RerankRequest,
    SparseEmbedRequest,
    TeiRerankRequest,
    TokenizeRequest,
)

REQUEST_ID_HEADER = "x-request-id"  # set by Serve's proxy when the client sends none


async def cohere_embed(ingress: IngressPath, request: Request) -> Response:
    """Cohere's embed (v2): ``texts``, ``input_type``, ``embedding_types`` (float, int8, uint8, binary,
    ubinary), ``truncate`` (END or NONE), ``max_tokens``, ``output_dimension``."""
    body = await ingress.parse_body(request, CohereEmbedRequest)
    route = ingress.route_for(body.model, "/v2/embed")
    lane = route.lane
    check_dimensions(
        body.output_dimension, lane.dimension or 0, lane.matryoshka_dimensions, "output_dimension"
    )
    types = tuple(body.embedding_types or ("float",))
    check_embedding_types(types, lane.quantization)
    prompt = resolve_prompt(lane.prompt_table, lane.default_prompt, body.input_type)
    job = TokenizeJob(
        body.texts,
        body.truncate == "END",
        prompt=prompt,
        max_tokens=body.max_tokens,
        field="texts",
        truncate_hint='"truncate": "END"',
    )
    options = ingress.response_options(
        request, route, "cohere_embed", dimensions=body.output_dimension, embedding_types=types
    )
    return await ingress.run_encoder(request, route, job, options)


async def rerank(ingress: IngressPath, request: Request, path: str) -> Response:
    """Cohere v2 / Jina rerank: documents by relevance to the query, best first. A cross-encoder scores
    (query, document) pairs; an embedding model, their cosine."""
    body = await ingress.parse_body(request, RerankRequest)
    route = ingress.route_for(body.model, path)
    docs = tuple(body.documents) if body.return_documents else None
    job = rerank_job(
        route.lane.task,
        route.lane.prompt_table,
        body.query,
        body.documents,
        True,
        body.max_tokens_per_doc,
    )
    options = ingress.response_options(request, route, "rerank", rerank=RerankOptions(body.top_n, docs))
    return await ingress.run_encoder(request, route, job, options)


async def rerank_tei(ingress: IngressPath, request: Request) -> Response:
    """TEI's rerank: a list of ``{index, score, text?}``, best first."""
    body = await ingress.parse_body(request, TeiRerankRequest)
    route = ingress.route_for(body.model, "/rerank")
    docs = tuple(body.texts) if body.return_text else None
    lane = route.lane
    job = rerank_job(lane.task, lane.prompt_table, body.query, body.texts, body.truncate, None, "texts")
    rerank = RerankOptions(documents=docs, raw_scores=body.raw_scores)
    return await ingress.run_encoder(
        request, route, job, ingress.response_options(request, route, "rerank_tei", rerank=rerank)
    )


async def embed_sparse(ingress: IngressPath, request: Request) -> Response:
    """TEI's sparse embeddings (SPLADE models): per input, ``{index, value}`` of its non-zero weights."""
    body = await ingress.parse_body(request, SparseEmbedRequest)
    route = ingress.route_for(body.model, "/embed_sparse")
    lane = route.lane
    prompt = resolve_prompt(lane.prompt_table, lane.default_prompt, prompt_name=body.prompt_name)
    job = TokenizeJob(body.texts, body.truncate, prompt=prompt, field="inputs")
    return await ingress.run_encoder(
        request, route, job, ingress.response_options(request, route, "embed_sparse")
    )


async def tokenize(ingress: IngressPath, request: Request) -> Response:
    """The served model's tokenizer (with its prompt): ids, counts and, optionally, character offsets
    into ``prompt + text`` per input."""
    body = await ingress.parse_body(request, TokenizeRequest)
    route = ingress.router.route(body.model)
    ingress.authorize(route.model)
    lane = route.lane
    check_input_count(len(body.texts), ingress.limits.max_inputs_per_request)
    prompt = resolve_prompt(lane.prompt_table, lane.default_prompt, body.input_type, body.prompt_name)
    job = TokenizeJob(body.texts, body.truncate, prompt=prompt)
    trace = ingress.tracing.start_request(request.headers.get(REQUEST_ID_HEADER, ""))
    start_ns = time.time_ns()
    timeout = request_timeout(request.headers.get(TIMEOUT_HEADER), ingress.config.request_timeout_s)
    call = ingress.handle(route.model, MODEL).tokenize.remote(job, lane.version)
    try:
        result = await asyncio.wait_for(call, timeout)
    except asyncio.TimeoutError:
        call.cancel()
        raise DeadlineExceededError("no answer from the model's tokenizer in time") from None
    except Exception as exc:
        raise as_service_error(exc) from None
    finally:
        if trace is not None:
            attributes = {"model": route.model, "version": lane.version, "route": "tokenize"}
            ingress.tracing.finish_request(trace, start_ns, time.time_ns(), attributes)
    if isinstance(result, ServiceError):
        raise result
    payload = tokenize_payload(route.model, lane.version, prompt, result, body.return_offsets)
    media_type = negotiate_media_type(request.headers.get("accept"))
    return Response(
        render(payload, media_type), media_type=media_type, headers={"X-Model-Version": lane.version}
    )
