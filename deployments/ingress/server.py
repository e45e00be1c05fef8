"""The HTTP ingress: parse and validate, route by the request's ``model``, answer.

It routes and answers; it does not batch. Each request goes to its model's pipeline (the ``Model``
deployment of the model's application, called by name), which groups it with the model's other requests
through the stages; the model's batches form in its Inference deployment. Errors from any stage arrive
here and are turned into HTTP responses by ``errors`` only.
"""

# No `from __future__ import annotations`: FastAPI must see real annotations (Request) on the methods.
import asyncio
import dataclasses
import logging
import time
from typing import Any

from fastapi import Request
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.responses import Response

from contracts.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    NotReadyError,
    OverloadedError,
    ServiceError,
    UnsupportedTaskError,
)
from contracts.outputs import ResponseOptions, SerializedResponse
from contracts.outputs import Route as RouteName
from contracts.tokenized import TokenizeJob
from deployments.access.gate import AccessGate
from deployments.config import RouterArgs, resolve_path
from deployments.ingress import generation, retrieval
from deployments.ingress.access import AccessControl, admission, ingress_replicas
from deployments.ingress.accounting import RequestAccounting
from deployments.ingress.api import api, body_doc
from deployments.ingress.errors import (
    as_service_error,
    error_response,
    status_of,
)
from deployments.ingress.fallback import DEGRADED_HEADER, FallbackCache, cache_key
from deployments.ingress.limits import check_job_size
from deployments.ingress.retrieval import REQUEST_ID_HEADER
from deployments.ingress.routing import ModelRouter, Route
from deployments.link.client import LinkClient
from deployments.link.frames import this_node_dir
from deployments.observability.metrics import model_call, tenant_input_tokens
from deployments.observability.setup import setup_replica
from deployments.pipeline.card import MODEL, ModelCard
from deployments.pipeline.request_group import ModelRequest
from deployments.pipeline.transport import carrying_any_size
from deployments.user_config import IngressConfig
from postprocess.render import negotiate_media_type, render
from preprocess.generation import ChatCompletionRequest, CompletionRequest
from preprocess.parsing import (
    TIMEOUT_HEADER,
    RequestT,
    check_body_size,
    check_dimensions,
    check_embedding_types,
    parse_body,
    request_timeout,
)
from preprocess.prompts import resolve_prompt
from preprocess.schemas import (
    CohereEmbedRequest,
    EmbeddingsRequest,
    PredictRequest,
    RerankRequest,
    SparseEmbedRequest,
    TeiRerankRequest,
    TokenizeRequest,
)

HEALTH_TIMEOUT_S = 5.0
# How often each model's card is read again: a rollout or a new candidate share reaches the router
# within this, with no redeploy of the router.
CARD_REFRESH_S = 1.0
CARD_TIMEOUT_S = 2.0
# How often the ingress asks Serve how many ingress replicas run (each enforces 1/n of a tenant's limits).
REPLICA_COUNT_S = 10.0

log = logging.getLogger("textserve.ingress")


# Above IngressConfig.max_in_flight, so the ingress itself answers 503 + Retry-After in our error format;
# Serve's own queue (max_queued_requests) is the backstop behind it. Past that backstop Serve answers before
# our code runs (the replica's own HTTP server behind HAProxy, or Serve's fallback proxy): 503 in text/plain,
# "Request dropped due to backpressure", with Retry-After only if backpressure_config sets it (errors.py's
# RETRY_AFTER_S; a literal: deployments.tools.check reads these options from the source).
@serve.deployment(
    name="Ingress",
    ray_actor_options={"num_cpus": 0.2},
    max_ongoing_requests=1024,
    max_queued_requests=256,
    backpressure_config={"retry_after_s": 1},
)
@serve.ingress(api)
class Ingress:
    async def __init__(self, args: RouterArgs) -> None:
        self.tracing = setup_replica(args.observability)
        RequestAccounting.access_log = args.observability.access_log
        self.router = ModelRouter(args.models, args.default)
        self.limits = args.limits
        keys_file = args.auth.keys_file
        self._gate = AccessGate(resolve_path(keys_file) if keys_file else None)
        self._auth = args.auth
        AccessControl.gate = self._gate
        self.config = IngressConfig()
        self._in_flight = 0
        self._handles: dict[tuple[str, str], DeploymentHandle] = {}
        self._link = LinkClient(this_node_dir(), self.config.local_link_max_in_flight)
        self._fallback_bytes = 0.0
        self._fallback = FallbackCache(0)
        self.reconfigure({})  # the defaults, until Serve hands over the config's user_config
        self._link.refresh(self.router.models)
        await self._refresh_cards()
        self._refresher = asyncio.get_running_loop().create_task(self._keep_cards_fresh())

    def handle(self, app: str, deployment: str) -> DeploymentHandle:
        key = (app, deployment)
        handle = self._handles.get(key)
        if handle is None:
            # Serve's handle carries a request and its answer whatever their size (pipeline/transport.py).
            handle = serve.get_deployment_handle(deployment, app_name=app)
            handle = self._handles[key] = carrying_any_size(handle, name=f"{app}/{deployment}")
        return handle

    async def _refresh_cards(self) -> None:
        async def one(model: str) -> None:
            try:
                call = self.handle(model, MODEL).card.remote()
                card: ModelCard = await asyncio.wait_for(call, CARD_TIMEOUT_S)
            except Exception as exc:  # not deployed yet, or rolling: keep routing by the last card
                log.debug("no card from model %s yet: %r", model, exc)
                return
            self._link.saw(model, card.link)  # Serve still routes to that replica: its socket may be used
            # Clients name a model by its application's name (an alias when it differs from the manifest's).
            self.router.update(card if card.name == model else dataclasses.replace(card, name=model))

        # As many card calls as the model has replicas (up to 8), at once, so that Serve's replica choice
        # (the less loaded of two) reaches each of them.
        calls = [one(m) for m in self.router.models for _ in range(self._link.card_calls(m))]
        await asyncio.gather(*calls)

    async def _keep_cards_fresh(self) -> None:
        last_keys = last_count = time.monotonic()
        while True:
            await asyncio.sleep(CARD_REFRESH_S)
            self._link.refresh(self.router.models)
            await self._refresh_cards()
            now = time.monotonic()
            if self._gate.enabled and now - last_keys >= self._auth.reload_interval_s:
                last_keys = now
                self._gate.reload_if_changed()  # a rotated key or policy takes effect with no restart
            if self._gate.enabled and now - last_count >= REPLICA_COUNT_S:
                last_count = now
                self._gate.set_replicas(await ingress_replicas())

    async def _read_body(self, request: Request) -> bytes:
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise InvalidRequestError("Content-Length header is not a number", "content-length")
            check_body_size(int(declared), limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            check_body_size(size, limit)
            chunks.append(chunk)
        return b"".join(chunks)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        config = IngressConfig.model_validate(user_config)
        self.config = config
        self._link.max_in_flight = config.local_link_max_in_flight
        if config.fallback_cache_mb * 2**20 != self._fallback_bytes:
            self._fallback_bytes = config.fallback_cache_mb * 2**20
            self._fallback = FallbackCache(int(self._fallback_bytes))

    async def run_encoder(
        self, request: Request, route: Route, job: TokenizeJob, options: ResponseOptions
    ) -> Response:
        """``job``: the request's inputs; its deadline, id and trace are set here."""
        check_job_size(job, self.limits)
        timeout = request_timeout(request.headers.get(TIMEOUT_HEADER), self.config.request_timeout_s)
        if self._in_flight >= self.config.max_in_flight:  # bounded: refuse early instead of queueing
            raise OverloadedError(f"over {self.config.max_in_flight} requests in flight; retry shortly")
        request_id = request.headers.get(REQUEST_ID_HEADER, "")
        trace = self.tracing.start_request(request_id)  # None unless this request is sampled
        start_ns = time.time_ns()
        key = (route.model, cache_key(options, job))
        job = dataclasses.replace(job, deadline=time.time() + timeout, request_id=request_id, trace=trace)
        options = dataclasses.replace(options, request_id=request_id)
        self._in_flight += 1
        lane = route.lane
        priority = admission().policy.priority
        model_request = ModelRequest(job, options, lane.version, lane.role, route.pinned, priority)
        result: SerializedResponse | ServiceError
        try:
            # On timeout (or the client leaving: Serve cancels this handler) the call is cancelled, and the
            # pipeline drops the request before it costs model time.
            result = await asyncio.wait_for(self._call_model(route.model, model_request), timeout)
        except asyncio.TimeoutError:
            result = DeadlineExceededError(f"no answer within the request's deadline of {timeout:g} s")
        except Exception as exc:  # a stage failed as a whole (its replica died: wrapped by Ray)
            result = as_service_error(exc)
        finally:
            self._in_flight -= 1
            if trace is not None:
                attributes = {"model": route.model, "version": lane.version}
                self.tracing.finish_request(trace, start_ns, time.time_ns(), attributes)
        return self._answer(result, key)

    async def _call_model(self, model: str, request: ModelRequest) -> SerializedResponse | ServiceError:
        """``Model.run`` in the model's pipeline: over the link to a replica on this node while it has one
        under the link's cap, else by Serve's handle (any node; Serve's replica choice and queue bounds)."""
        reply = await self._link.try_call(model, request)
        if reply is not None:
            model_call("link")
            answer: SerializedResponse | ServiceError = reply.result()
            return answer
        model_call("handle")
        response = self.handle(model, MODEL).run.remote(request)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise

    def _answer(self, result: SerializedResponse | ServiceError, key: Any) -> Response:
        headers = {}
        if isinstance(result, ServiceError):
            degraded = self._fallback.recall(key) if self._fallback.enabled else None
            if degraded is None or status_of(result) < 500:
                return error_response(result)
            result, headers = degraded, {DEGRADED_HEADER: "true"}
        else:
            self.charge(result.input_tokens)
            if self._fallback.enabled:
                self._fallback.remember(key, result)
        headers["X-Model-Version"] = result.model_version
        return Response(result.body, media_type=result.media_type, headers=headers)

    def authorize(self, model: str) -> None:
        """403 unless the request's tenant may use ``model``."""
        self._gate.check_model(admission(), model)

    def charge(self, input_tokens: int) -> None:
        """Count an answer's input tokens against its tenant's tokens/min (and in the metrics)."""
        tenant = admission().tenant
        self._gate.charge(tenant, input_tokens)
        tenant_input_tokens(tenant, input_tokens)

    async def parse_body(self, request: Request, schema: type[RequestT]) -> RequestT:
        return parse_body(await self._read_body(request), request.headers.get("content-type"), schema)

    def route_for(self, model: str | None, path: str) -> Route:
        """The request's model and version, refused (400) when the model's task has no such route."""
        route = self.router.route(model)
        self.authorize(route.model)
        lane = route.lane
        if path not in lane.routes:
            raise UnsupportedTaskError(
                f"model {route.model!r} serves task {lane.task!r}, not {path}: use {', '.join(lane.routes)}",
                "model",
            )
        return route

    def response_options(
        self, request: Request, route: Route, name: RouteName, **extra: Any
    ) -> ResponseOptions:
        media_type = negotiate_media_type(request.headers.get("accept"))
        return ResponseOptions(route=name, media_type=media_type, model_id=route.model, **extra)

    @api.post("/v1/embeddings", openapi_extra=body_doc(EmbeddingsRequest))
    async def embeddings(self, request: Request) -> Response:
        """OpenAI-compatible embeddings. ``model``: a served name, or ``name:version`` to pin a version.
        ``input`` may be token ids (without special tokens); extensions: ``embedding_types``, prompts."""
        body = await self.parse_body(request, EmbeddingsRequest)
        route = self.route_for(body.model, "/v1/embeddings")
        lane = route.lane
        check_dimensions(body.dimensions, lane.dimension or 0, lane.matryoshka_dimensions)
        types = tuple(body.embedding_types or ())
        check_embedding_types(types, lane.quantization)
        prompt = resolve_prompt(lane.prompt_table, lane.default_prompt, body.input_type, body.prompt_name)
        job = TokenizeJob(body.texts, body.truncate, prompt=prompt, token_ids=body.token_ids)
        options = self.response_options(
            request,
            route,
            "embeddings",
            encoding_format=body.encoding_format,
            dimensions=body.dimensions,
            embedding_types=types,
        )
        return await self.run_encoder(request, route, job, options)

    # The retrieval routes: thin here (Serve maps only this class's own methods), their work in retrieval.py.
    @api.post("/v2/embed", openapi_extra=body_doc(CohereEmbedRequest))
    async def cohere_embed(self, request: Request) -> Response:
        """Cohere's embed (v2): ``texts``, ``input_type``, ``embedding_types`` (float, int8, uint8, binary,
        ubinary), ``truncate`` (END or NONE), ``max_tokens``, ``output_dimension``."""
        return await retrieval.cohere_embed(self, request)

    @api.post("/v1/rerank", openapi_extra=body_doc(RerankRequest))
    async def rerank(self, request: Request) -> Response:
        """Cohere v2 / Jina rerank: ``results`` of ``{index, relevance_score, document?}``, best first. A
        cross-encoder scores (query, document) pairs; an embedding model, their cosine."""
        return await retrieval.rerank(self, request, "/v1/rerank")

    @api.post("/v2/rerank", openapi_extra=body_doc(RerankRequest))
    async def rerank_v2(self, request: Request) -> Response:
        """Cohere's v2 rerank path: the same as ``/v1/rerank``."""
        return await retrieval.rerank(self, request, "/v2/rerank")

    @api.post("/rerank", openapi_extra=body_doc(TeiRerankRequest))
    async def rerank_tei(self, request: Request) -> Response:
        """TEI's rerank: a list of ``{index, score, text?}``, best first (``raw_scores``: no activation)."""
        return await retrieval.rerank_tei(self, request)

    @api.post("/embed_sparse", openapi_extra=body_doc(SparseEmbedRequest))
    async def embed_sparse(self, request: Request) -> Response:
        """TEI's sparse embeddings (SPLADE models): per input, ``{index, value}`` of its non-zero weights."""
        return await retrieval.embed_sparse(self, request)

    @api.post("/tokenize", openapi_extra=body_doc(TokenizeRequest))
    async def tokenize(self, request: Request) -> Response:
        """The served model's tokenizer (with its prompt): ids, counts and, optionally, character offsets."""
        return await retrieval.tokenize(self, request)

    # Generation (task generate): thin here, their work in generation.py.
    @api.post("/v1/completions", openapi_extra=body_doc(CompletionRequest))
    async def completions(self, request: Request) -> Response:
        """OpenAI completions: ``prompt`` (text or token ids), ``max_tokens``, ``temperature``, ``top_p``,
        ``seed``, ``stop``; ``stream: true`` answers as server-sent events ending in ``data: [DONE]``."""
        return await generation.completions(self, request, chat=False)

    @api.post("/v1/chat/completions", openapi_extra=body_doc(ChatCompletionRequest))
    async def chat_completions(self, request: Request) -> Response:
        """OpenAI chat completions: ``messages`` through the model's chat template; otherwise as
        ``/v1/completions`` (``stream_options.include_usage`` adds a last chunk with ``usage``)."""
        return await generation.completions(self, request, chat=True)

    @api.post("/predict", openapi_extra=body_doc(PredictRequest))
    async def predict(self, request: Request) -> Response:
        """Embeddings or class labels, by the model's task. ``model``: a name, ``name:version`` or none."""
        body = await self.parse_body(request, PredictRequest)
        route = self.route_for(body.model, "/predict")
        options = self.response_options(request, route, "predict")
        job = TokenizeJob(body.inputs, body.truncate, field="text" if body.text is not None else "texts")
        return await self.run_encoder(request, route, job, options)

    @api.get("/v1/models")
    async def models(self) -> Response:
        """Every served model by name (the default one marked), then each served version as
        ``name:version``, with its task, dimension or labels, max tokens, role, traffic share and the
        ``limits`` a client must respect (inputs per request, tokens per input, body bytes...)."""
        policy = admission().policy  # a tenant sees the models it may use
        entries = self.router.entries(self.limits)
        body = {"object": "list", "data": [e for e in entries if policy.allows(e["id"])]}
        return Response(render(body, "application/json"), media_type="application/json")

    @api.get("/healthz")
    async def healthz(self) -> Response:
        """200 while at least one model is ready (each model's state in the body); 503 when none is.
        One model down does not take the endpoint out of a load balancer: the others still answer."""

        async def state(model: str) -> str:
            if model not in self.router.cards:
                return "starting"
            try:
                await asyncio.wait_for(self.handle(model, MODEL).ready.remote(), HEALTH_TIMEOUT_S)
            except Exception as exc:
                log.warning("health probe of model %s failed: %r", model, exc)
                return "unavailable"
            return "ready"

        models = self.router.models
        states = dict(zip(models, await asyncio.gather(*(state(m) for m in models)), strict=True))
        if "ready" not in states.values():
            return error_response(NotReadyError(f"no model is ready: {states}"))
        versions = {m: self.router.cards[m].versions for m, s in states.items() if s == "ready"}
        body = {
            "status": "ready" if all(s == "ready" for s in states.values()) else "degraded",
            "default_model": self.router.default,
            "models": states,
            "versions": versions,
        }
        return Response(render(body, "application/json"), media_type="application/json")
