"""The HTTP ingress: parse and validate, chain the stages without awaiting in between, answer.

Errors from any stage arrive here and are turned into HTTP responses by ``http_errors`` only.
"""

# No `from __future__ import annotations`: FastAPI must see real annotations (Request) on the methods.
import asyncio
import logging
import time
from typing import Any

from fastapi import FastAPI, Request
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from deployments.config import IngressConfig, LimitsConfig, ObservabilityConfig
from deployments.ingress.accounting import RequestAccounting
from deployments.ingress.errors import (
    as_service_error,
    error_response,
    handle_http_exception,
    handle_service_error,
    status_of,
)
from deployments.ingress.fallback import DEGRADED_HEADER, FallbackCache, cache_key
from deployments.ingress.request_group import PipelineJob, RequestGroup
from deployments.ingress.routing import Lane, Lanes, model_entry
from deployments.observability.setup import setup_replica
from deployments.pipeline.batching import ExpectedCompany
from postprocess.contracts import ResponseOptions, SerializedResponse
from postprocess.render import negotiate_media_type, render
from preprocess.contracts import EncodedTexts, TokenizeJob
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
    parse_body,
    pinned_version,
    request_timeout,
)
from preprocess.schemas import EmbeddingsRequest, PredictRequest

HEALTH_TIMEOUT_S = 5.0
REQUEST_ID_HEADER = "x-request-id"  # set by Serve's proxy when the client sends none
# Groups in flight at once, so the stages overlap (one group infers while the next tokenizes). Measured on
# 2 cores: 2 gave 271-278 seq/s on 32-text requests against 232-238 with 3 or 4, and no less on single texts.
MAX_GROUPS_IN_FLIGHT = 2
_DEFAULTS = IngressConfig()
# Stands in for a request whose client went away or whose deadline passed: later stages pass errors on
# untouched, so it costs no model time. Nobody reads it (the caller is gone).
_GONE = DeadlineExceededError("the client went away or the deadline passed before the model ran")


log = logging.getLogger("textserve.ingress")


def _body_doc(schema: type) -> dict[str, Any]:
    # The body is parsed by hand (for size limits and one error format) but documented in OpenAPI.
    json_schema = schema.model_json_schema(ref_template="#/components/schemas/{model}")
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": json_schema}}}}


api = FastAPI(title="textserve", version="0.1.0", description="Embeddings and text classification.")
api.add_exception_handler(ServiceError, handle_service_error)
api.add_exception_handler(StarletteHTTPException, handle_http_exception)
api.add_exception_handler(Exception, handle_service_error)
api.add_middleware(RequestAccounting)


@serve.deployment(name="Ingress", ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=256)
@serve.ingress(api)
class Ingress:
    def __init__(
        self,
        lanes: list[Lane],
        serializer: DeploymentHandle,
        limits: LimitsConfig,
        observability: ObservabilityConfig,
    ) -> None:
        self._tracing = setup_replica(observability)
        RequestAccounting.access_log = observability.access_log
        self._lanes = Lanes(lanes)
        self._serializer = serializer
        self._manifest = self._lanes.stable.manifest
        self._limits = limits
        self._config = _DEFAULTS
        self._in_flight = 0
        self._company = ExpectedCompany()
        self._group_cap = _DEFAULTS.max_group_size  # what the group batcher holds now
        self._fallback_bytes = 0.0
        self._fallback = FallbackCache(0)

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
        self._pipeline.set_max_batch_size(config.max_group_size)
        self._group_cap = config.max_group_size
        if config.fallback_cache_mb * 2**20 != self._fallback_bytes:
            self._fallback_bytes = config.fallback_cache_mb * 2**20
            self._fallback = FallbackCache(int(self._fallback_bytes))
        self._pipeline.set_batch_wait_timeout_s(config.group_wait_timeout_s)

    async def _run(
        self, request: Request, lane: Lane, texts: list[str], truncate: bool, options: ResponseOptions
    ) -> Response:
        check_input_count(texts, self._limits.max_inputs_per_request)
        timeout = request_timeout(request.headers.get(TIMEOUT_HEADER), self._config.request_timeout_s)
        if self._in_flight >= self._config.max_in_flight:  # bounded: refuse early instead of queueing
            raise OverloadedError(f"over {self._config.max_in_flight} requests in flight; retry shortly")
        request_id = request.headers.get(REQUEST_ID_HEADER, "")
        trace = self._tracing.start_request(request_id)  # None unless this request is sampled
        start_ns = time.time_ns()
        job = PipelineJob(
            TokenizeJob(texts, truncate, time.time() + timeout, request_id, trace),
            options,
            version=lane.version,
            request_id=request_id,
        )
        self._in_flight += 1
        if self._config.adaptive_wait:
            # Serve reads both when a group's first member is taken: they hold for that group.
            now = time.monotonic()
            self._company.arrived(self._in_flight, now)
            cap = self._company.cap(self._config.max_group_size)
            if cap != self._group_cap:  # Serve's setter also checks the replica's config: only on change
                self._group_cap = cap
                self._pipeline.set_max_batch_size(cap)
            wait = self._company.wait_s(self._in_flight, now, self._config.group_wait_timeout_s)
            self._pipeline.set_batch_wait_timeout_s(wait)
        try:
            result = await asyncio.wait_for(self._pipeline(job), timeout)
        except asyncio.TimeoutError:
            job.abandon()
            result = DeadlineExceededError(f"no answer within the request's deadline of {timeout:g} s")
        except asyncio.CancelledError:  # the client disconnected: Serve cancelled this handler
            job.abandon()
            raise
        finally:
            self._in_flight -= 1
            if trace is not None:
                self._tracing.finish_request(trace, start_ns, time.time_ns(), {"version": lane.version})
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

        Each stage's result is checked here (Serve's router would wait for it before the next call
        anyway), so members whose client left are dropped before they cost model time. Each request
        comes back with its own result or its own error.
        """
        self._company.started(len(jobs))
        try:
            return await self._in_lanes(jobs)
        finally:
            self._company.answered(len(jobs), time.monotonic())

    async def _in_lanes(self, jobs: list[PipelineJob]) -> list[SerializedResponse | ServiceError]:
        first = jobs[0].version
        if all(j.version == first for j in jobs):
            return await self._through_stages(jobs, self._lanes.by_version[first])
        # A canary split: each version's members go through their own lane, concurrently.
        by_version: dict[str, list[int]] = {}
        for i, job in enumerate(jobs):
            by_version.setdefault(job.version, []).append(i)
        parts = await asyncio.gather(
            *(
                self._through_stages([jobs[i] for i in idx], self._lanes.by_version[v])
                for v, idx in by_version.items()
            )
        )
        results: list[SerializedResponse | ServiceError] = [_GONE] * len(jobs)
        for idx, part in zip(by_version.values(), parts, strict=True):
            for i, result in zip(idx, part, strict=True):
                results[i] = result
        return results

    async def _through_stages(
        self, jobs: list[PipelineJob], lane: Lane
    ) -> list[SerializedResponse | ServiceError]:
        group = RequestGroup(jobs)
        try:
            encoded = await group.sending(lane.tokenizer.encode.remote([j.tokenize for j in jobs]))
            outputs: list[Any] = group.keep_live(encoded, _GONE)
            if any(isinstance(e, EncodedTexts) for e in outputs):
                outputs = group.keep_live(await group.sending(lane.inference.infer.remote(outputs)), _GONE)
            if all(isinstance(o, ServiceError) for o in outputs):
                return outputs
            serialized = self._serializer.serialize.remote(outputs, [j.options for j in jobs])
            results: list[SerializedResponse | ServiceError] = await group.sending(serialized)
        except (Exception, asyncio.CancelledError) as exc:
            if group.all_gone:  # cancelled on purpose: nobody is waiting for these answers
                return [_GONE] * len(jobs)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return [as_service_error(exc)] * len(jobs)  # a stage failed as a whole (wrapped by Ray)
        finally:
            group.release()
        return results

    def _lane_for(self, requested: str | None) -> Lane:
        pinned = pinned_version(requested, self._manifest.name, self._lanes.versions)
        return self._lanes.choose(pinned, self._config.candidate_share)

    @api.post("/v1/embeddings", openapi_extra=_body_doc(EmbeddingsRequest))
    async def embeddings(self, request: Request) -> Response:
        """OpenAI-compatible embeddings. ``model: name:version`` pins a served version."""
        body = parse_body(
            await self._read_body(request), request.headers.get("content-type"), EmbeddingsRequest
        )
        lane = self._lane_for(body.model)
        m = lane.manifest
        if m.task != "embed":
            raise UnsupportedTaskError(f"model {m.name!r} is a {m.task} model: use POST /predict", "model")
        check_dimensions(body.dimensions, m.output.dimension or 0)
        options = ResponseOptions(
            route="embeddings",
            media_type=negotiate_media_type(request.headers.get("accept")),
            encoding_format=body.encoding_format,
            dimensions=body.dimensions,
        )
        return await self._run(request, lane, body.texts, body.truncate, options)

    @api.post("/predict", openapi_extra=_body_doc(PredictRequest))
    async def predict(self, request: Request) -> Response:
        """Embeddings or class labels, by the served model's task. ``model: name:version`` pins a version."""
        body = parse_body(await self._read_body(request), request.headers.get("content-type"), PredictRequest)
        lane = self._lane_for(body.model)
        options = ResponseOptions(
            route="predict", media_type=negotiate_media_type(request.headers.get("accept"))
        )
        return await self._run(request, lane, body.inputs, body.truncate, options)

    @api.get("/v1/models")
    async def models(self) -> Response:
        """The served model; then each served version by ``name:version``, with its role and share."""
        share = self._config.candidate_share if self._lanes.candidate is not None else 0.0
        entries = [model_entry(self._manifest, self._manifest.name, "stable", 1.0 - share)]
        for lane in self._lanes:
            role = "stable" if lane is self._lanes.stable else "candidate"
            entries.append(
                model_entry(
                    lane.manifest,
                    f"{lane.manifest.name}:{lane.version}",
                    role,
                    share if role == "candidate" else 1.0 - share,
                )
            )
        return Response(
            render({"object": "list", "data": entries}, "application/json"), media_type="application/json"
        )

    @api.get("/healthz")
    async def healthz(self) -> Response:
        """200 once every served version has an inference replica with its model loaded, 503 before."""
        probes = [lane.inference.ready.remote() for lane in self._lanes]

        async def wait_ready() -> list[Any]:
            return [await probe for probe in probes]

        try:
            identities = await asyncio.wait_for(wait_ready(), HEALTH_TIMEOUT_S)
        except Exception as exc:
            log.warning("health probe failed: %r", exc)
            for probe in probes:
                probe.cancel()
            return error_response(NotReadyError("model is not loaded yet"))
        body = {
            "status": "ready",
            "model": identities[0].name,
            "version": identities[0].version,
            "versions": [identity.version for identity in identities],
        }
        return Response(render(body, "application/json"), media_type="application/json")
