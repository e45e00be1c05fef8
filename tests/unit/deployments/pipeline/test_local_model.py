"""The pipeline's local copy of a CPU model (deployments/pipeline/local_model.py): groups that form while
another runs start at once on another thread, each gets its own answers."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from deployments.config import ObservabilityConfig, RuntimeConfig
from deployments.observability.metrics import BatchMetrics
from deployments.observability.setup import setup_replica
from deployments.pipeline.local_model import LocalModel
from deployments.pipeline.stage_work import TokenizeWork
from deployments.repository.manifest import ResolvedModel
from postprocess.contracts import ModelOutput
from preprocess.contracts import TokenizeJob
from preprocess.errors import ModelExecutionError, ServiceError


def _local(model: ResolvedModel, workers: int) -> tuple[LocalModel, TokenizeWork]:
    tracing = setup_replica(ObservabilityConfig())
    return LocalModel(model, RuntimeConfig(), BatchMetrics(), tracing, workers), TokenizeWork(model, tracing)


def _held_forward(local: LocalModel, parties: int, timeout_s: float = 5.0) -> list[str]:
    """Make every forward pass wait (up to ``timeout_s``) until ``parties`` passes are in it at once; the
    names of the threads that ran them."""
    barrier = threading.Barrier(parties, timeout=timeout_s)
    runner = local._runner
    forward = runner._forward
    threads: list[str] = []

    def held(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        threads.append(threading.current_thread().name)
        barrier.wait()  # BrokenBarrierError (the pass fails) when the other group never starts beside it
        return forward(ids, mask)

    runner._forward = held  # type: ignore[method-assign]
    return threads


TEXTS = ("a first group", "and a second one")


async def _groups_at_once(local: LocalModel, tokenize: TokenizeWork) -> list[ModelOutput | ServiceError]:
    groups = [tokenize.encode([TokenizeJob([text])]) for text in TEXTS]
    answers = await asyncio.gather(*(local.infer(g) for g in groups))
    return [a[0] for a in answers]


def test_two_groups_run_at_once_each_with_its_own_answer(default_model: ResolvedModel) -> None:
    local, tokenize = _local(default_model, workers=2)
    alone = [asyncio.run(local.infer(tokenize.encode([TokenizeJob([t])])))[0] for t in TEXTS]
    threads = _held_forward(local, parties=2)
    answers = asyncio.run(_groups_at_once(local, tokenize))
    assert len(set(threads)) == 2  # both passes were in the model at once, on two threads
    for got, want in zip(answers, alone, strict=True):
        assert isinstance(got, ModelOutput) and isinstance(want, ModelOutput)
        np.testing.assert_allclose(got.values, want.values, atol=1e-6)


def test_with_one_worker_the_second_group_waits_for_the_first(default_model: ResolvedModel) -> None:
    local, tokenize = _local(default_model, workers=1)
    threads = _held_forward(local, parties=2, timeout_s=0.5)
    answers = asyncio.run(_groups_at_once(local, tokenize))
    # The first pass waited for a second that could not start beside it (one thread), so it failed;
    # the second then ran on the same thread, after it.
    assert all(isinstance(a, ModelExecutionError) for a in answers)
    assert len(set(threads)) == 1
