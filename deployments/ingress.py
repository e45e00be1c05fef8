"""The HTTP ingress: parse and validate, chain the stages without awaiting in between, answer.

Errors from any stage arrive here and are turned into HTTP responses by ``http_errors`` only.
"""

# No `from __future__ import annotations`: FastAPI must see real annotations (Request) on the methods.
import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from deployments.batching import AdaptiveWaitWindow
from deployments.config import IngressConfig, LimitsConfig
from deployments.fallback import DEGRADED_HEADER, FallbackCache, cache_key
from deployments.http_errors import (
    as_service_error,
    error_response,
    handle_http_exception,
    handle_service_error,
    status_of,
)
from deployments.manifest import ResolvedModel
from postprocess.contracts import ResponseOptions, SerializedResponse
from postprocess.render import negotiate_media_type, render
from preprocess.contracts import TokenizeJob
from preprocess.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    ServiceError,
    UnsupportedTaskError,
)
from preprocess.parsing import (
    TIMEOUT_HEADER,
    check_dimensions,
    check_input_count,
    check_model_name,
    parse_body,
    request_timeout,
)
from preprocess.schemas import EmbeddingsRequest, PredictRequest

HEALTH_TIMEOUT_S = 5.0
# Groups in flight at once, so the stages overlap (one group infers while the next tokenizes). Measured on
# 2 cores: 2 gave 271-278 seq/s on 32-text requests against 232-238 with 3 or 4, and no less on single texts.
MAX_GROUPS_IN_FLIGHT = 2
_DEFAULTS = IngressConfig()


@dataclass(frozen=True, slots=True)
class PipelineJob:
    tokenize: TokenizeJob
    options: ResponseOptions


log = logging.getLogger("ray.serve")


def _body_doc(schema: type) -> dict[str, Any]:
    # The body is parsed by hand (for size limits and one error format) but documented in OpenAPI.
    json_schema = schema.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": json_schema}}}}


api = FastAPI(title="textserve", version="0.1.0", description="Embeddings and text classification.")
api.add_exception_handler(ServiceError, handle_service_error)
api.add_exception_handler(StarletteHTTPException, handle_http_exception)
api.add_exception_handler(Exception, handle_service_error)


@serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=256)
@serve.ingress(api)
class Ingress:
    def __init__(
        self,
        tokenizer: DeploymentHandle,
        inference: DeploymentHandle,
        serializer: DeploymentHandle,
        model: ResolvedModel,
        limits: LimitsConfig,
    ) -> None:
        self._tokenizer = tokenizer
        self._inference = inference
        self._serializer = serializer
        self._manifest = model.manifest
        self._limits = limits
        self._config = _DEFAULTS
        self._in_flight = 0
        self._fallback_bytes = 0.0
        self._fallback = FallbackCache(0)
        self._window = AdaptiveWaitWindow(
            _DEFAULTS.group_wait_timeout_s, _DEFAULTS.min_wait_s, _DEFAULTS.max_wait_s
        )

    async def _read_body(self, request: Request) -> bytes:
        limit = self._limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise InvalidRequestError("Content-Length header is not a number")
            if int(declared) > limit:
                raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        config = IngressConfig.model_validate(user_config)
        self._config = config
        self._window = AdaptiveWaitWindow(config.group_wait_timeout_s, config.min_wait_s, config.max_wait_s)
        self._pipeline.set_max_batch_size(config.max_group_size)
        if config.fallback_cache_mb * 2**20 != self._fallback_bytes:
            self._fallback_bytes = config.fallback_cache_mb * 2**20
            self._fallback = FallbackCache(int(self._fallback_bytes))
        self._pipeline.set_batch_wait_timeout_s(config.group_wait_timeout_s)

    async def _run(
        self, request: Request, texts: list[str], truncate: bool, options: ResponseOptions
    ) -> Response:
        check_input_count(texts, self._limits.max_inputs_per_request)
        timeout = request_timeout(request.headers.get(TIMEOUT_HEADER), self._config.request_timeout_s)
        if self._in_flight >= self._config.max_in_flight:  # bounded: refuse early instead of queueing
            raise OverloadedError(f"over {self._config.max_in_flight} requests in flight; retry shortly")
        job = PipelineJob(TokenizeJob(texts, truncate, deadline=time.time() + timeout), options)
        self._in_flight += 1
        try:
            result = await asyncio.wait_for(self._pipeline(job), timeout)
        except asyncio.TimeoutError:
            result = DeadlineExceededError(f"no answer within the request's deadline of {timeout:g} s")
        finally:
            self._in_flight -= 1
        key = cache_key(options, texts, truncate) if self._fallback.enabled else None
        headers = {}
        if isinstance(result, ServiceError):
            degraded = self._fallback.recall(key) if key is not None and status_of(result) >= 500 else None
            if degraded is None:
                return error_response(result)
            result, headers = degraded, {DEGRADED_HEADER: "true"}
        elif key is not None:
            self._fallback.remember(key, result)
        headers["X-Model-Version"] = result.model_version
        return Response(result.body, media_type=result.media_type, headers=headers)

    @serve.batch(
        max_batch_size=_DEFAULTS.max_group_size,
        batch_wait_timeout_s=_DEFAULTS.group_wait_timeout_s,
        max_concurrent_batches=MAX_GROUPS_IN_FLIGHT,
    )
    async def _pipeline(self, jobs: list[PipelineJob]) -> list[SerializedResponse | ServiceError]:
        """One group of concurrent requests through the stages: one call per stage for all of them.

        Chained DeploymentResponses: Ray hands each stage's result to the next without a round-trip
        through here. Each request comes back with its own result or its own error.
        """
        encoded = self._tokenizer.encode.remote([job.tokenize for job in jobs])
        outputs = self._inference.infer.remote(encoded)
        serialized = self._serializer.serialize.remote(outputs, [job.options for job in jobs])
        if self._config.adaptive_wait:
            self._pipeline.set_batch_wait_timeout_s(
                self._window.observe(len(jobs), self._config.max_group_size)
            )
        try:
            results: list[SerializedResponse | ServiceError] = await serialized
        except Exception as exc:  # a stage failed as a whole (wrapped by Ray): every member gets the error
            return [as_service_error(exc)] * len(jobs)
        return results

    @api.post("/v1/embeddings", openapi_extra=_body_doc(EmbeddingsRequest))
    async def embeddings(self, request: Request) -> Response:
        """OpenAI-compatible embeddings."""
        body = parse_body(
            await self._read_body(request), request.headers.get("content-type"), EmbeddingsRequest
        )
        m = self._manifest
        check_model_name(body.model, m.name, m.version)
        if m.task != "embed":
            raise UnsupportedTaskError(f"model {m.name!r} is a {m.task} model: use POST /predict", "model")
        check_dimensions(body.dimensions, m.output.dimension or 0)
        options = ResponseOptions(
            route="embeddings",
            media_type=negotiate_media_type(request.headers.get("accept")),
            encoding_format=body.encoding_format,
            dimensions=body.dimensions,
        )
        return await self._run(request, body.texts, body.truncate, options)

    @api.post("/predict", openapi_extra=_body_doc(PredictRequest))
    async def predict(self, request: Request) -> Response:
        """Embeddings or class labels, by the served model's task."""
        body = parse_body(await self._read_body(request), request.headers.get("content-type"), PredictRequest)
        check_model_name(body.model, self._manifest.name, self._manifest.version)
        options = ResponseOptions(
            route="predict", media_type=negotiate_media_type(request.headers.get("accept"))
        )
        return await self._run(request, body.inputs, body.truncate, options)

    @api.get("/v1/models")
    async def models(self) -> Response:
        m = self._manifest
        entry: dict[str, Any] = {
            "id": m.name,
            "object": "model",
            "owned_by": "textserve",
            "version": m.version,
            "task": m.task,
            "max_tokens": m.input.max_tokens,
        }
        if m.task == "embed":
            entry["dimension"] = m.output.dimension
        else:
            entry["labels"] = list(m.output.labels or ())
        return Response(
            render({"object": "list", "data": [entry]}, "application/json"), media_type="application/json"
        )

    @api.get("/healthz")
    async def healthz(self) -> Response:
        """200 once an inference replica has loaded and warmed up its model, 503 before."""
        probe = self._inference.ready.remote()

        async def wait_ready() -> Any:
            return await probe

        try:
            identity = await asyncio.wait_for(wait_ready(), HEALTH_TIMEOUT_S)
        except Exception as exc:
            log.warning("health probe failed: %r", exc)
            probe.cancel()
            return error_response(NotReadyError("model is not loaded yet"))
        body = {"status": "ready", "model": identity.name, "version": identity.version}
        return Response(render(body, "application/json"), media_type="application/json")
