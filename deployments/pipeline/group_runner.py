"""Run groups of requests through a runner so that a failure costs only the request that caused it.

A batch that raises is retried request by request: a poisoned input gets its own error while the
others in the same batch still get their results. A device that failed for good is not retried on:
every request gets a retryable 503 so clients go to a healthy replica. No Ray; the inference
deployment calls this.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from contracts.errors import DeadlineExceededError, ModelExecutionError, ServiceError, UnavailableError
from contracts.outputs import ModelIdentity, ModelOutput, SparseRows
from contracts.tokenized import EncodedTexts
from deployments.repository.manifest import ResolvedModel
from deployments.runtime.batching import BatchLimits
from deployments.runtime.runner_base import BatchRunner
from postprocess.retrieval import SPARSE_THRESHOLD

log = logging.getLogger("textserve.groups")

Group = list[EncodedTexts | ServiceError]  # requests queued together, some may have failed already
Answers = list[ModelOutput | ServiceError]
MakeOutput = Callable[[EncodedTexts, np.ndarray], ModelOutput]


@dataclass(frozen=True, slots=True)
class OutputMaker:
    """A request's rows as its ``ModelOutput`` (a ``MakeOutput``), labelled with the model that made them."""

    identity: ModelIdentity
    task: str
    labels: tuple[str, ...]
    activation: str = ""

    @classmethod
    def of(cls, model: ResolvedModel) -> OutputMaker:
        manifest = model.manifest
        identity = ModelIdentity(name=manifest.name, version=manifest.version)
        labels = tuple(manifest.output.labels or ())
        return cls(identity, manifest.task, labels, manifest.activation or "")

    def __call__(self, encoded: EncodedTexts, values: np.ndarray) -> ModelOutput:
        return ModelOutput(
            model=self.identity,
            task=self.task,
            # Sparse rows leave the replica sparse: dense, one SPLADE text is a vocabulary of floats.
            values=SparseRows.of(values, SPARSE_THRESHOLD) if self.task == "sparse_embed" else values,
            token_count=encoded.token_count,
            labels=self.labels,
            truncated=encoded.truncated,
            trace=encoded.trace,
            activation=self.activation,
        )


def device_gone() -> UnavailableError:
    return UnavailableError("this replica's device failed; it is being replaced, retry shortly")


@dataclass(frozen=True, slots=True)
class GroupRun:
    answers: list[Answers]  # one list per group, one entry per request, in order
    sequences: int
    real_tokens: int
    padded_tokens: int
    isolated_failures: int  # requests that failed alone after their batch failed


def drop_expired(groups: list[Group], now: float) -> list[Group]:
    """Requests whose deadline has passed are answered with 504 before they cost model time."""
    expired = DeadlineExceededError("the request's deadline passed before the model could run it")
    return [
        [
            expired if isinstance(m, EncodedTexts) and m.deadline is not None and m.deadline < now else m
            for m in g
        ]
        for g in groups
    ]


def run_groups(
    runner: BatchRunner, groups: list[Group], limits: BatchLimits, make_output: MakeOutput
) -> GroupRun:
    groups = drop_expired(groups, time.time())
    requests = [e for group in groups for e in group if isinstance(e, EncodedTexts)]
    sequences = [s for r in requests for s in r.sequences()]
    per_request: list[np.ndarray | ServiceError]
    failures = 0
    real = padded = 0
    try:
        result = runner.run(sequences, limits)
        if len(result.values) != len(sequences):
            raise RuntimeError(f"model returned {len(result.values)} rows for {len(sequences)} inputs")
        per_request = _split(result.values, requests)
        real, padded = result.real_tokens, result.padded_tokens
    except Exception:
        if runner.fatal_error is not None:
            # Retrying one by one on a dead device fails the same way, request after request.
            log.exception("device failed on a batch of %d requests", len(requests))
            per_request = [device_gone()] * len(requests)
            failures = len(requests)
        elif len(requests) <= 1:
            log.exception("model failed on a request")
            per_request = [ModelExecutionError("the model failed on this input")] * len(requests)
            failures = len(requests)
        else:
            log.exception("model failed on a batch of %d requests: retrying them one by one", len(requests))
            per_request = [_run_alone(runner, r, limits) for r in requests]
            failures = sum(isinstance(v, ServiceError) for v in per_request)
    answers: list[Answers] = []
    values = iter(per_request)
    for group in groups:
        group_answers: Answers = []
        for member in group:
            if isinstance(member, ServiceError):
                group_answers.append(member)  # failed upstream: passed on untouched
                continue
            value = next(values)
            group_answers.append(value if isinstance(value, ServiceError) else make_output(member, value))
        answers.append(group_answers)
    return GroupRun(answers, len(sequences), real, padded, failures)


def _split(values: np.ndarray, requests: list[EncodedTexts]) -> list[np.ndarray | ServiceError]:
    out: list[np.ndarray | ServiceError] = []
    start = 0
    for r in requests:
        out.append(values[start : start + len(r)])
        start += len(r)
    return out


def _run_alone(runner: BatchRunner, request: EncodedTexts, limits: BatchLimits) -> np.ndarray | ServiceError:
    try:
        values = runner.run(list(request.sequences()), limits).values
    except Exception:
        log.exception("model failed on one request of %d texts", len(request))
        return ModelExecutionError("the model failed on this input; other requests were not affected")
    if len(values) != len(request):
        return ModelExecutionError(f"model returned {len(values)} rows for {len(request)} inputs")
    return values
