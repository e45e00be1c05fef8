"""The pipeline's local copy of a CPU model (deployments/pipeline/local_model.py): groups that form while
another runs start at once on another thread, each gets its own answers."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from contracts.errors import ModelExecutionError, ServiceError
from contracts.outputs import ModelOutput
from contracts.tokenized import TokenizeJob
from deployments.config import ModelConfig, ObservabilityConfig, RuntimeConfig
from deployments.observability.metrics import BatchMetrics
from deployments.observability.setup import setup_replica
from deployments.pipeline import local_model
from deployments.pipeline.local_model import LocalModel, LocalModels
from deployments.pipeline.stage_work import TokenizeWork
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import resolve_model
from deployments.runtime import heap, lone_pass
from deployments.runtime.lone_torch import SharedForward
from deployments.runtime.runner_base import BatchRunner


def _local(
    model: ResolvedModel,
    workers: int,
    lone_pass: Literal["auto", "onnx", "off"] = "off",
    max_overlap: float = 0.25,
) -> tuple[LocalModel, TokenizeWork]:
    tracing = setup_replica(ObservabilityConfig())
    runtime = RuntimeConfig(lone_pass=lone_pass, lone_pass_max_overlap=max_overlap)
    return LocalModel(model, runtime, BatchMetrics(), tracing, workers), TokenizeWork(model, tracing)


def _held_forward(
    local: LocalModel, parties: int, timeout_s: float = 5.0, runners: list[BatchRunner] | None = None
) -> list[str]:
    """Make every forward pass of ``runners`` (the copy's) wait (up to ``timeout_s``) until ``parties``
    passes are in them at once; the names of the threads that ran them."""
    barrier = threading.Barrier(parties, timeout=timeout_s)
    threads: list[str] = []
    for runner in runners or [local._runner]:
        forward = runner._forward

        def held(ids: np.ndarray, mask: np.ndarray, forward: Any = forward) -> np.ndarray:
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


class _CpuDevice:
    def remote(self) -> object:
        async def answer() -> str:
            return "cpu"

        return answer()


class _CpuInference:
    """An Inference handle that answers at once that its model runs on a CPU."""

    device = _CpuDevice()


@pytest.fixture
def _unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("_unfrozen")
def test_the_copy_is_frozen_out_of_full_collections_before_it_takes_groups(
    default_model: ResolvedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(heap.RAY_SWITCH, raising=False)
    tracing = setup_replica(ObservabilityConfig())
    models = LocalModels({"1": default_model}, {"1": _CpuInference()}, RuntimeConfig(), tracing, workers=1)
    served_at_freeze: list[LocalModel | None] = []

    def freeze() -> int:
        served_at_freeze.append(models.get("1"))
        return heap.freeze_loaded_heap()

    monkeypatch.setattr(local_model, "freeze_loaded_heap", freeze)
    asyncio.run(models._load_each())
    copy = models.get("1")
    assert served_at_freeze == [None] and copy is not None  # frozen first, then served
    tracked = {id(o) for o in gc.get_objects()}
    assert id(copy) not in tracked and id(copy._runner) not in tracked


_affinity = os.sched_getaffinity  # the real one: two_cpus replaces os's for the replica's code


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The replica may use two CPUs (where lone passes were measured), whatever this machine has."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("pinning a lone pass's two threads needs two CPUs")
    two = set(allowed[:2])
    monkeypatch.setattr(lone_pass.os, "sched_getaffinity", lambda pid: two)
    return two


def _with_lone_pass(onnx_repository: Path) -> tuple[LocalModel, TokenizeWork, LocalModel]:
    """A copy with its lone pass (the repository's ONNX export), its tokenizer, and the copy on one thread."""
    served = resolve_model(ModelConfig(repository=str(onnx_repository)), hash_files=False)
    local, tokenize = _local(served, workers=2, lone_pass="auto")
    one_thread, _ = _local(served, workers=2)
    assert local._lone is not None and one_thread._lone is None
    return local, tokenize, one_thread


def _answers_alike(local: LocalModel, one_thread: LocalModel, tokenize: TokenizeWork, text: str) -> None:
    group = tokenize.encode([TokenizeJob([text])])
    got = asyncio.run(local.infer(group))[0]
    want = asyncio.run(one_thread.infer(group))[0]
    assert isinstance(got, ModelOutput) and isinstance(want, ModelOutput)
    assert float(np.dot(got.values[0], want.values[0])) >= 0.9999  # cosine: normalized embeddings


def test_a_group_alone_runs_on_both_pinned_cores_and_gives_the_copys_answers(
    onnx_repository: Path, two_cpus: set[int]
) -> None:
    local, tokenize, one_thread = _with_lone_pass(onnx_repository)
    assert local._lone is not None
    caller = local._lone.executor.submit(_affinity, 0).result()
    assert caller == {min(two_cpus)}  # ONNX Runtime's worker gets the other (session option)
    threads = _held_forward(local, parties=1, runners=[local._runner, local._lone.runner])
    for text in TEXTS:
        _answers_alike(local, one_thread, tokenize, text)
    assert threads == ["lone-pass_0", "lone-pass_0"]


def test_at_light_load_a_group_that_forms_during_a_lone_pass_waits_for_it_on_its_thread(
    onnx_repository: Path, two_cpus: set[int]
) -> None:
    served = resolve_model(ModelConfig(repository=str(onnx_repository)), hash_files=False)
    local, tokenize = _local(served, workers=2, lone_pass="auto")
    assert local._lone is not None
    in_pass = threading.Semaphore(1)  # a second pass at once would find it taken
    overlapped: list[bool] = []
    runner = local._lone.runner
    forward = runner._forward

    def alone(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        overlapped.append(not in_pass.acquire(blocking=False))
        try:
            time.sleep(0.05)  # long enough for the second group to arrive during it
            return forward(ids, mask)
        finally:
            in_pass.release()

    runner._forward = alone  # type: ignore[method-assign]
    threads = _held_forward(local, parties=1, runners=[local._runner])  # records any pass on the copy
    answers = asyncio.run(_groups_at_once(local, tokenize))
    assert all(isinstance(a, ModelOutput) for a in answers)
    assert overlapped == [False, False] and threads == []  # both on the lone pass, one after the other
    assert local._running == 0 and local._beside == 0


def test_on_the_lone_pass_a_group_as_long_as_torch_from_runs_on_the_copys_torch_graph(
    onnx_repository: Path, two_cpus: set[int]
) -> None:
    local, tokenize, one_thread = _with_lone_pass(onnx_repository)
    lone = local._lone
    assert lone is not None
    lone.torch, lone.torch_from = SharedForward(local._runner), 12  # as if measured faster from 12 tokens
    ran: list[str] = []
    for name, runner in (("onnx", lone.runner), ("torch", lone.torch)):
        forward = runner._forward

        def recorded(
            ids: np.ndarray, mask: np.ndarray, forward: Any = forward, name: str = name
        ) -> np.ndarray:
            ran.append(f"{name} {ids.shape[1]}")
            return forward(ids, mask)

        runner._forward = recorded  # type: ignore[method-assign]
    for text in ("short", "a text of more than twelve tokens, run on the copy's own graph on both cores"):
        _answers_alike(local, one_thread, tokenize, text)
    (short, long) = ran
    assert short.startswith("onnx ") and int(short.split()[1]) < 12
    assert long.startswith("torch ") and int(long.split()[1]) >= 12


def test_once_recent_groups_overlap_a_group_that_forms_while_another_runs_takes_the_one_thread_copy(
    onnx_repository: Path, two_cpus: set[int]
) -> None:
    served = resolve_model(ModelConfig(repository=str(onnx_repository)), hash_files=False)
    local, tokenize = _local(served, workers=2, lone_pass="auto", max_overlap=0.0)
    assert local._lone is not None
    threads = _held_forward(local, parties=2, runners=[local._runner, local._lone.runner])
    answers = asyncio.run(_groups_at_once(local, tokenize))
    assert all(isinstance(a, ModelOutput) for a in answers)
    assert sorted(threads) == ["local-model_0", "lone-pass_0"]  # both in a pass at once, one each
    assert local._running == 0 and local._beside == 0


class _Recorded:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


def test_a_group_on_the_copy_records_its_queue_wait_and_its_batch(default_model: ResolvedModel) -> None:
    """The queue-wait histogram is Inference's and the copy's alike: small groups, most traffic, run here."""
    local, tokenize = _local(default_model, workers=1)
    wait, sizes = _Recorded(), _Recorded()
    local._metrics.queue_wait_ms, local._metrics.batch_size = wait, sizes  # type: ignore[assignment]
    gate = threading.Event()
    forward = local._runner._forward

    def held(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        gate.wait(5.0)  # the first group holds the one worker, so the second waits for it
        return forward(ids, mask)

    local._runner._forward = held  # type: ignore[method-assign]

    async def two() -> None:
        first = asyncio.ensure_future(local.infer(tokenize.encode([TokenizeJob([TEXTS[0]])])))
        second = asyncio.ensure_future(local.infer(tokenize.encode([TokenizeJob([TEXTS[1]])])))
        await asyncio.sleep(0.2)
        gate.set()
        await asyncio.gather(first, second)

    asyncio.run(two())
    assert len(wait.values) == 2 and sizes.values == [1, 1]
    assert max(wait.values) >= 150.0  # the second group waited (ms) while the first held the worker
