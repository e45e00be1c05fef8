"""The model pipeline's stages without Ray: small groups are tokenized and serialized in the pipeline replica,
large ones by the stage deployments, with the same answers either way; inference runs in Inference on both
paths, told the group's priority class (stand-in handles record the calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest

from contracts.errors import InputTooLongError, ServiceError
from contracts.outputs import ModelIdentity, ModelOutput, ResponseOptions, SerializedResponse
from contracts.tokenized import EncodedTexts, Priority, TokenizeJob
from deployments.config import ObservabilityConfig
from deployments.observability.setup import setup_replica
from deployments.pipeline.model import ModelDeployment, ServedVersion
from deployments.pipeline.request_group import ModelRequest, PipelineJob
from deployments.pipeline.stage_work import SerializeWork, TokenizeWork
from deployments.repository.manifest import ResolvedModel
from deployments.user_config import PipelineConfig

_PRIORITIES: list[Priority] = []  # the classes Inference was told, in call order
_SHARES: list[float] = []  # and the bulk share in force


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


def _infer(
    group: list[EncodedTexts | ServiceError], priority: Priority = "interactive", batch_min_share: float = 0.0
) -> list[ModelOutput | ServiceError]:
    """Stands in for Inference: one row per text, its token count / 3 in every column."""
    _PRIORITIES.append(priority)
    _SHARES.append(batch_min_share)
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
    deployment = ModelDeployment.func_or_class([served], serializer, ObservabilityConfig())
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


@pytest.mark.parametrize("inline_chars", [0, 10**6])
def test_every_group_infers_in_inference_told_its_class_on_either_path(pipeline, inline_chars: int) -> None:
    """The batch forms in one place, Inference, whose gate orders the classes: small groups too go there."""
    deployment, _, _ = pipeline
    deployment.reconfigure({"inline_chars": inline_chars, "batch_min_share": 0.4})
    options = ResponseOptions(route="embeddings")
    _PRIORITIES.clear()
    _SHARES.clear()
    for priority in ("batch", "interactive"):
        jobs = [PipelineJob(TokenizeJob(["a text"]), options, version="1", priority=priority)]
        answers = asyncio.run(deployment._through_stages(jobs, "1"))
        assert all(isinstance(a, SerializedResponse) for a in answers)
    assert _PRIORITIES == ["batch", "interactive"]
    assert _SHARES == [0.4, 0.4]  # the pipeline's setting reaches Inference's gate too


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
