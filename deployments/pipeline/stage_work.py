"""The work of the tokenize and serialize stages over a group of requests, with its metrics and spans.

The Tokenizer and Serializer deployments run it for large groups; the model's pipeline runs it itself for
small ones, where a hop to another replica costs more than the work (deployments/pipeline/model.py). Each
request gets its result or its own error, so one bad request never fails the others. No Ray Serve here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from contracts.errors import InternalError, ServiceError
from contracts.outputs import ModelIdentity, ModelOutput, ResponseOptions, SerializedResponse
from contracts.tokenized import EncodedTexts, TokenizeJob, TraceContext
from deployments.observability.metrics import StageMetrics
from deployments.observability.tracing import Tracing
from deployments.repository.manifest import ResolvedModel
from postprocess.render import serialize
from preprocess.tokenize import TextTokenizer, TokenDetails, encode_job

log = logging.getLogger("textserve.stages")
R = TypeVar("R")


def group_chars(jobs: Sequence[TokenizeJob]) -> int:
    """Characters a group asks to tokenize: its cost in both CPU stages (values to serialize follow it)."""
    return sum(job.size for job in jobs)


class _StageWork:
    """One request's step in a stage, timed and traced; its own failure is its answer."""

    def __init__(self, tracing: Tracing, span: str, activity: str, metric: StageMetrics) -> None:
        self._tracing = tracing
        self._span = span  # the trace span's name
        self._activity = activity  # what failed, for the log and the request's error
        self._ms = metric.ms

    def _one(
        self, work: Callable[[], R], trace: TraceContext | None, request_id: str = ""
    ) -> R | ServiceError:
        start = time.perf_counter()
        result: R | ServiceError
        try:
            result = work()
        except ServiceError as exc:
            result = exc
        except Exception:  # a bug on one request's input must not fail the others in its group
            log.exception("%s failed on a request", self._activity, extra={"request_id": request_id})
            result = InternalError(f"{self._activity} failed for this request")
        self._ms.observe((time.perf_counter() - start) * 1000.0)
        if trace is not None:
            end_ns = time.time_ns()
            self._tracing.record_span(trace, self._span, end_ns - _ns(start), end_ns)
        return result


class TokenizeWork(_StageWork):
    """One version's tokenizer: every id it makes is stamped with the tokenizer's id."""

    def __init__(self, model: ResolvedModel, tracing: Tracing) -> None:
        super().__init__(
            tracing, "tokenize", "tokenization", StageMetrics("tokenize_ms", "Time to tokenize one request.")
        )
        self._tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
        self._tokenizer_id = model.tokenizer_id
        self._pairs = model.manifest.task == "rerank"  # a cross-encoder reads (query, document) pairs

    def encode(self, jobs: Sequence[TokenizeJob]) -> list[EncodedTexts | ServiceError]:
        return [self._one(lambda job=job: self._encode(job), job.trace, job.request_id) for job in jobs]

    def details(self, job: TokenizeJob) -> list[TokenDetails]:
        """``/tokenize``: ids and offsets of each text, with the request's prompt."""
        return self._tokenizer.details(job.texts, job.prompt, job.truncate)

    def _encode(self, job: TokenizeJob) -> EncodedTexts:
        encoded = encode_job(self._tokenizer, job, self._pairs)
        return dataclasses.replace(
            encoded, deadline=job.deadline, trace=job.trace, tokenizer_id=self._tokenizer_id
        )


class SerializeWork(_StageWork):
    """Responses for one model's outputs; ``models``: its served versions, for their int8 ranges."""

    def __init__(self, tracing: Tracing, models: Sequence[ResolvedModel] = ()) -> None:
        super().__init__(
            tracing,
            "serialize",
            "serialization",
            StageMetrics("serialize_ms", "Time to serialize one response."),
        )
        self._ranges = {
            ModelIdentity(m.manifest.name, m.manifest.version): np.asarray(q.ranges, dtype=np.float32)
            for m in models
            if (q := m.manifest.quantization) is not None
        }

    def serialize(
        self,
        outputs: Sequence[ModelOutput | ServiceError],
        options: Sequence[ResponseOptions],
        float_decimals: int | None,
    ) -> list[SerializedResponse | ServiceError]:
        if len(outputs) != len(options):
            raise RuntimeError(f"{len(outputs)} outputs for {len(options)} requests")
        return [
            output
            if isinstance(output, ServiceError)
            else self._one(
                lambda o=output, opts=opts: serialize(o, opts, float_decimals, self._ranges.get(o.model)),
                output.trace,
            )
            for output, opts in zip(outputs, options, strict=True)
        ]


def _ns(perf_start: float) -> int:
    return int((time.perf_counter() - perf_start) * 1e9)
