"""The model pipeline's stages without Ray: small groups are tokenized and serialized in the pipeline replica
(and, for a CPU model, run on its local copy), large ones by the stage deployments, with the same answers
either way (stand-in handles record the calls)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest

from contracts.errors import InputTooLongError, ServiceError
from contracts.outputs import ModelIdentity, ModelOutput, ResponseOptions, SerializedResponse
from contracts.tokenized import EncodedTexts, Priority, TokenizeJob
from deployments.config import ObservabilityConfig, RuntimeConfig
from deployments.observability.setup import setup_replica
from deployments.pipeline.batching import BatchLimits
from deployments.pipeline.group_runner import OutputMaker, run_groups
from deployments.pipeline.local_model import LocalModels
from deployments.pipeline.model import ModelDeployment, ServedVersion
from deployments.pipeline.request_group import ModelRequest, PipelineJob
from deployments.pipeline.stage_work import SerializeWork, TokenizeWork
from deployments.repository.manifest import ResolvedModel
from deployments.runtime.backends import create_runner
from deployments.user_config import PipelineConfig


class _Call:
    """What ``handle.method.remote(...)`` returns: awaitable and cancellable."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def cancel(self) -> None:
        pass

    def __await__(self) -> Any:
        async def value() -> Any:
            return self._value

        return value().__await__()


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.calls = 0

    def remote(self, *args: Any) -> _Call:
        self.calls += 1
        return _Call(self.fn(*args))


class _Handle:
    def __init__(self, **methods: Callable[..., Any]) -> None:
        for name, fn in methods.items():
            setattr(self, name, _Method(fn))


def _infer(group: list[EncodedTexts | ServiceError]) -> list[ModelOutput | ServiceError]:
    """Stands in for Inference: one row per text, its token count / 3 in every column."""
    identity = ModelIdentity(name="all-MiniLM-L6-v2", version="1")
    return [
        m
        if isinstance(m, ServiceError)
        else ModelOutput(
            identity, "embed", np.repeat(np.diff(m.offsets).astype(np.float32)[:, None] / 3, 4, 1), len(m.ids)
        )
        for m in group
    ]


@pytest.fixture
def pipeline(default_model: ResolvedModel) -> tuple[ModelDeployment, _Handle, _Handle]:
    tracing = setup_replica(ObservabilityConfig())
    tokenizer = _Handle(encode=TokenizeWork(default_model, tracing).encode)
    serializer = _Handle(serialize=SerializeWork(tracing).serialize)
    served = ServedVersion(model=default_model, tokenizer=tokenizer, inference=_Handle(infer=_infer))
    no_local = RuntimeConfig(small_groups_in_pipeline=False)
    deployment = ModelDeployment.func_or_class([served], serializer, ObservabilityConfig(), no_local)
    return deployment, tokenizer, serializer


def _large_group() -> list[list[str]]:
    """40 one-text requests, over the default inline_chars together."""
    texts = [["the quick brown fox jumps over the lazy dog " * 5] for _ in range(40)]
    assert sum(len(t[0]) for t in texts) > PipelineConfig().inline_chars
    return texts


def _run(deployment: ModelDeployment, texts: list[list[str]]) -> list[SerializedResponse | ServiceError]:
    options = ResponseOptions(route="embeddings")
    jobs = [PipelineJob(TokenizeJob(t), options, version="1") for t in texts]
    return asyncio.run(deployment._through_stages(jobs, "1"))


def test_a_small_group_skips_the_stage_replicas(pipeline) -> None:
    deployment, tokenizer, serializer = pipeline
    answers = _run(deployment, [["a short text"], ["another one"]])
    assert (tokenizer.encode.calls, serializer.serialize.calls) == (0, 0)
    assert all(isinstance(a, SerializedResponse) for a in answers)


def test_a_large_group_goes_to_the_stage_replicas_with_the_same_answers(pipeline) -> None:
    deployment, tokenizer, serializer = pipeline
    texts = _large_group()
    assert sum(len(t[0]) for t in texts) > deployment._config.inline_chars
    offloaded = _run(deployment, texts)
    assert (tokenizer.encode.calls, serializer.serialize.calls) == (1, 1)
    deployment.reconfigure({"inline_chars": 10**6})
    inline = _run(deployment, texts)
    assert (tokenizer.encode.calls, serializer.serialize.calls) == (1, 1)  # no new calls
    assert [a.body for a in offloaded] == [a.body for a in inline]  # type: ignore[union-attr]


def test_a_large_interactive_group_stays_here_while_bulk_work_holds_the_stages(pipeline) -> None:
    deployment, tokenizer, serializer = pipeline
    texts = _large_group()
    options = ResponseOptions(route="embeddings")
    deployment._groups.scheduler.started("batch")  # a bulk group is in the stages

    def run(priority: Priority) -> None:
        jobs = [PipelineJob(TokenizeJob(t), options, version="1", priority=priority) for t in texts]
        answers = asyncio.run(deployment._through_stages(jobs, "1"))
        assert all(isinstance(a, SerializedResponse) for a in answers)

    run("interactive")
    assert (tokenizer.encode.calls, serializer.serialize.calls) == (0, 0)  # not queued behind the bulk
    run("batch")
    assert (tokenizer.encode.calls, serializer.serialize.calls) == (1, 1)
    deployment._groups.scheduler.finished("batch", 1.0)
    run("interactive")  # no bulk work now: the stages' batching is the better place for it
    assert (tokenizer.encode.calls, serializer.serialize.calls) == (2, 2)


def test_a_group_holds_at_most_max_group_inputs_and_a_larger_request_runs_alone(pipeline) -> None:
    """Bulk requests group by their inputs too, so that no call between replicas carries more than the cap
    (and a huge group does not hold its first request until the last one is done)."""
    deployment, tokenizer, _ = pipeline
    deployment.reconfigure({"max_group_inputs": 300, "inline_chars": 0})
    sizes = [200, 100, 50, 400, 3, 3]
    seen: list[int] = []
    encode = tokenizer.encode.fn

    def counting(jobs: list[TokenizeJob]) -> list[Any]:
        seen.append(sum(j.inputs for j in jobs))
        return encode(jobs)

    tokenizer.encode.fn = counting

    async def scenario() -> list[SerializedResponse | ServiceError]:
        options = ResponseOptions(route="embeddings")
        requests = [ModelRequest(TokenizeJob([f"text {i}"] * n), options, "1") for i, n in enumerate(sizes)]
        return await asyncio.gather(*(deployment.run(r) for r in requests))

    try:
        answers = asyncio.run(scenario())
    finally:
        deployment.reconfigure({})
    counts = [len(orjson.loads(a.body)["data"]) for a in answers]  # type: ignore[union-attr]
    assert counts == sizes
    assert max(seen) == 400 and all(n <= 300 for n in seen if n != 400)
    assert sum(seen) == sum(sizes)


def test_inline_chars_zero_sends_every_group_to_the_stages(pipeline) -> None:
    deployment, tokenizer, serializer = pipeline
    deployment.reconfigure({"inline_chars": 0})
    _run(deployment, [["x"]])
    assert (tokenizer.encode.calls, serializer.serialize.calls) == (1, 1)


def test_inline_a_bad_request_fails_alone(pipeline) -> None:
    deployment, _, _ = pipeline
    answers = _run(deployment, [["fine"], ["word " * 400], ["fine too"]])  # the middle one is over 256 tokens
    assert isinstance(answers[1], InputTooLongError)
    assert isinstance(answers[0], SerializedResponse) and isinstance(answers[2], SerializedResponse)


def test_float_decimals_reach_both_paths(pipeline) -> None:
    deployment, _, _ = pipeline
    deployment.reconfigure({"float_decimals": 0, "inline_chars": 0})
    offloaded = _run(deployment, [["three word text"]])  # 5 tokens with [CLS] and [SEP]: 5 / 3 per column
    deployment.reconfigure({"float_decimals": 0})
    inline = _run(deployment, [["three word text"]])
    deployment.reconfigure({})
    full = _run(deployment, [["three word text"]])
    vectors = [orjson.loads(a[0].body)["data"][0]["embedding"] for a in (offloaded, inline, full)]  # type: ignore[union-attr]
    assert vectors[0] == vectors[1] == [2.0] * 4
    assert vectors[2] == pytest.approx([5 / 3] * 4, abs=1e-6)


@pytest.fixture(scope="module")
def local_pipeline(default_model: ResolvedModel) -> tuple[ModelDeployment, _Handle]:
    """A CPU model's pipeline with its local copy; Inference stands in with the same runner code."""
    tracing = setup_replica(ObservabilityConfig())
    runner = create_runner(default_model, "cpu")
    output = OutputMaker.of(default_model)
    limits = BatchLimits(32, 256)
    inference = _Handle(
        infer=lambda group: run_groups(runner, [group], limits, output).answers[0], device=lambda: "cpu"
    )
    served = ServedVersion(
        model=default_model,
        tokenizer=_Handle(encode=TokenizeWork(default_model, tracing).encode),
        inference=inference,
    )
    serializer = _Handle(serialize=SerializeWork(tracing).serialize)
    deployment = ModelDeployment.func_or_class([served], serializer, ObservabilityConfig(), RuntimeConfig())
    _load(deployment._local)
    return deployment, inference


def _load(local: LocalModels) -> None:
    """Start the background load and wait for it, as the replica's first request would start it."""

    async def load() -> None:
        local.start()
        if local._loading is not None:
            await local._loading

    asyncio.run(load())


def _vectors(answers: list[SerializedResponse | ServiceError]) -> np.ndarray:
    return np.array([orjson.loads(a.body)["data"][0]["embedding"] for a in answers])  # type: ignore[union-attr]


def test_a_cpu_models_small_group_runs_on_its_local_copy_with_inferences_answers(local_pipeline) -> None:
    deployment, inference = local_pipeline
    texts = [["a short text"], ["another, slightly longer one"], ["x"]]
    before = inference.infer.calls
    local = _run(deployment, texts)
    assert inference.infer.calls == before  # no call to Inference
    deployment.reconfigure({"inline_chars": 0})
    try:
        remote = _run(deployment, texts)
    finally:
        deployment.reconfigure({})
    assert inference.infer.calls == before + 1
    assert _vectors(local).shape == (3, 384)
    np.testing.assert_allclose(_vectors(local), _vectors(remote), atol=1e-5)


def test_a_large_group_still_goes_to_inference(local_pipeline) -> None:
    deployment, inference = local_pipeline
    before = inference.infer.calls
    answers = _run(deployment, _large_group())
    assert inference.infer.calls == before + 1 and len(answers) == 40


def test_a_bad_request_fails_alone_on_the_local_copy(local_pipeline) -> None:
    deployment, _ = local_pipeline
    answers = _run(deployment, [["fine"], ["word " * 400], ["fine too"]])
    assert isinstance(answers[1], InputTooLongError)
    assert _vectors([answers[0], answers[2]]).shape == (2, 384)


@pytest.mark.parametrize(("device", "enabled"), [("cuda", True), ("cuda:0", True), ("cpu", False)])
def test_no_local_copy_where_inference_runs_on_a_gpu_or_when_switched_off(
    default_model: ResolvedModel, device: str, enabled: bool
) -> None:
    runtime = RuntimeConfig(small_groups_in_pipeline=enabled)
    tracing = setup_replica(ObservabilityConfig())
    local = LocalModels(
        {"1": default_model}, {"1": _Handle(device=lambda: device)}, runtime, tracing, workers=2
    )
    _load(local)
    assert local.get("1") is None


def test_the_copy_loads_in_a_context_of_its_own_not_the_starters(default_model: ResolvedModel) -> None:
    """Serve cancels the handle calls made in a request's context with that request: a first health probe
    that timed out while Inference loaded used to take the copy's load with it."""
    request: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)
    seen: list[str | None] = []

    def device() -> str:
        seen.append(request.get())
        return "cuda"  # nothing to load: the context is what is checked

    tracing = setup_replica(ObservabilityConfig())
    handles = {"1": _Handle(device=device)}
    local = LocalModels({"1": default_model}, handles, RuntimeConfig(), tracing, workers=2)

    async def probe() -> None:
        request.set("a health probe")
        local.start()
        assert local._loading is not None
        await local._loading

    asyncio.run(probe())
    assert seen == [None]


def test_the_local_copy_loads_when_inference_answers_cpu(local_pipeline) -> None:
    deployment, _ = local_pipeline
    assert deployment._local.get("1") is not None
