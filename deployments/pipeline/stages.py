"""The tokenizer and serializer deployments: thin Ray Serve adapters over preprocess/ and postprocess/.

Both take a group of requests per call (the model's pipeline groups concurrent requests) and answer
each one with a result or its own error, so one bad request never fails the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray import serve

from deployments.config import ObservabilityConfig, SerializerConfig
from deployments.observability.metrics import StageMetrics
from deployments.observability.setup import setup_replica
from deployments.repository.manifest import ResolvedModel
from postprocess.contracts import ModelOutput, ResponseOptions, SerializedResponse
from postprocess.render import serialize
from preprocess.contracts import EncodedTexts, TokenizeJob
from preprocess.errors import InternalError, ServiceError
from preprocess.tokenize import TextTokenizer

log = logging.getLogger("textserve.stages")

# A small group is tokenized or serialized on the replica's event loop: a few texts take tens of
# microseconds, less than the hop to a worker thread and back that Serve makes for a sync method
# (single texts at concurrency 8: +5 % req/s, median of six alternating runs). Bounded by size, not
# count, so one huge text never holds the loop; larger groups go to the stage's own threads.
INLINE_CHARS = 16384  # characters to tokenize (~0.5 ms)
INLINE_VALUES = 32768  # floats to serialize (64 embeddings of 384 or more of smaller ones)


def _stage_threads(name: str) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix=name)


@serve.deployment(
    name="Tokenizer", ray_actor_options={"num_cpus": 0.2}, max_ongoing_requests=64, max_queued_requests=256
)
class TokenizerDeployment:
    def __init__(self, model: ResolvedModel, observability: ObservabilityConfig) -> None:
        self._tracing = setup_replica(observability)
        self._tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
        self._tokenizer_id = model.tokenizer_id
        self._ms = StageMetrics("tokenize_ms", "Time to tokenize one request.").ms
        self._threads = _stage_threads("tokenize")

    async def encode(self, jobs: list[TokenizeJob]) -> list[EncodedTexts | ServiceError]:
        if sum(len(text) for job in jobs for text in job.texts) <= INLINE_CHARS:
            return self._encode(jobs)
        return await asyncio.get_running_loop().run_in_executor(self._threads, self._encode, jobs)

    def _encode(self, jobs: list[TokenizeJob]) -> list[EncodedTexts | ServiceError]:
        results: list[EncodedTexts | ServiceError] = []
        for job in jobs:
            start = time.perf_counter()
            try:
                encoded = self._tokenizer.encode(job.texts, job.truncate)
                results.append(
                    dataclasses.replace(
                        encoded, deadline=job.deadline, trace=job.trace, tokenizer_id=self._tokenizer_id
                    )
                )
            except ServiceError as exc:
                results.append(exc)
            except Exception:  # a bug on one request's input must not fail the others in its group
                log.exception("tokenizer failed on a request", extra={"request_id": job.request_id})
                results.append(InternalError("tokenization failed for this request"))
            self._ms.observe((time.perf_counter() - start) * 1000.0)
            if job.trace is not None:
                end_ns = time.time_ns()
                self._tracing.record_span(job.trace, "tokenize", end_ns - _ns(start), end_ns)
        return results


def _ns(perf_start: float) -> int:
    return int((time.perf_counter() - perf_start) * 1e9)


@serve.deployment(
    name="Serializer", ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=64, max_queued_requests=256
)
class SerializerDeployment:
    def __init__(self, observability: ObservabilityConfig) -> None:
        self._tracing = setup_replica(observability)
        self._config = SerializerConfig()
        self._ms = StageMetrics("serialize_ms", "Time to serialize one response.").ms
        self._threads = _stage_threads("serialize")

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._config = SerializerConfig.model_validate(user_config)

    async def serialize(
        self, outputs: list[ModelOutput | ServiceError], options: list[ResponseOptions]
    ) -> list[SerializedResponse | ServiceError]:
        if sum(o.values.size for o in outputs if not isinstance(o, ServiceError)) <= INLINE_VALUES:
            return self._serialize(outputs, options)
        return await asyncio.get_running_loop().run_in_executor(
            self._threads, self._serialize, outputs, options
        )

    def _serialize(
        self, outputs: list[ModelOutput | ServiceError], options: list[ResponseOptions]
    ) -> list[SerializedResponse | ServiceError]:
        if len(outputs) != len(options):
            raise RuntimeError(f"{len(outputs)} outputs for {len(options)} requests")
        results: list[SerializedResponse | ServiceError] = []
        for output, opts in zip(outputs, options, strict=True):
            if isinstance(output, ServiceError):
                results.append(output)
                continue
            start = time.perf_counter()
            try:
                results.append(serialize(output, opts, self._config.float_decimals))
            except ServiceError as exc:
                results.append(exc)
            except Exception:
                log.exception("serializer failed on a request")
                results.append(InternalError("serialization failed for this request"))
            self._ms.observe((time.perf_counter() - start) * 1000.0)
            if output.trace is not None:
                end_ns = time.time_ns()
                self._tracing.record_span(output.trace, "serialize", end_ns - _ns(start), end_ns)
        return results
