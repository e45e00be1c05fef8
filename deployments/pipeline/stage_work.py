"""The work of the tokenize and serialize stages over a group of requests, with its metrics and spans.

The Tokenizer and Serializer deployments run it for large groups; the model's pipeline runs it itself for
small ones, where a hop to another replica costs more than the work (deployments/pipeline/model.py). Each
request gets its result or its own error, so one bad request never fails the others. No Ray Serve here.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from deployments.observability.metrics import StageMetrics
from deployments.observability.tracing import Tracing
from deployments.repository.manifest import ResolvedModel
from postprocess.contracts import ModelOutput, ResponseOptions, SerializedResponse
from postprocess.render import serialize
from preprocess.contracts import EncodedTexts, TokenizeJob
from preprocess.errors import InternalError, ServiceError
from preprocess.tokenize import TextTokenizer

log = logging.getLogger("textserve.stages")


def group_chars(jobs: Sequence[TokenizeJob]) -> int:
    """Characters a group asks to tokenize: its cost in both CPU stages (values to serialize follow it)."""
    return sum(len(text) for job in jobs for text in job.texts)


class TokenizeWork:
    """One version's tokenizer: every id it makes is stamped with the tokenizer's id."""

    def __init__(self, model: ResolvedModel, tracing: Tracing) -> None:
        self._tracing = tracing
        self._tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
        self._tokenizer_id = model.tokenizer_id
        self._ms = StageMetrics("tokenize_ms", "Time to tokenize one request.").ms

    def encode(self, jobs: Sequence[TokenizeJob]) -> list[EncodedTexts | ServiceError]:
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


class SerializeWork:
    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing
        self._ms = StageMetrics("serialize_ms", "Time to serialize one response.").ms

    def serialize(
        self,
        outputs: Sequence[ModelOutput | ServiceError],
        options: Sequence[ResponseOptions],
        float_decimals: int | None,
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
                results.append(serialize(output, opts, float_decimals))
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


def _ns(perf_start: float) -> int:
    return int((time.perf_counter() - perf_start) * 1e9)
