"""Inference's batch window is a maximum wait, never a minimum: a group that finds the model idle goes at
once; one that finds a batch on the model may wait for company, at most the window, and a full batch
leaves at once. Serve's real ``@serve.batch`` queue, a real tiny model, no Ray cluster."""

from __future__ import annotations

import asyncio
import time

import pytest

from contracts.tokenized import TokenizeJob
from deployments.config import ModelConfig, ObservabilityConfig, RuntimeConfig
from deployments.pipeline.inference import InferenceDeployment
from deployments.repository.resolve import resolve_model
from preprocess.tokenize import TextTokenizer
from tests.support.models import build_classifier

pytestmark = pytest.mark.usefixtures("serve_batch_queue")  # Serve's real batch queue (conftest.py)

WINDOW_S = 0.9
MODEL_S = 0.3  # how long the first batch holds the model


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("models")
    build_classifier(repo, version="1")
    return resolve_model(
        ModelConfig(repository=str(repo), name="tiny-sentiment", task="classify", precision="fp32")
    )


def _inference(model, max_batch_size: int) -> InferenceDeployment:
    inference = InferenceDeployment.func_or_class(model, "cpu", RuntimeConfig(), ObservabilityConfig())
    inference.reconfigure(
        {
            "max_batch_size": max_batch_size,
            "batch_wait_timeout_s": WINDOW_S,
            "adaptive_wait": False,
            "min_wait_s": 0.0,
            "max_wait_s": 1.0,
        }
    )
    run = inference._run_on_model_thread

    def slow_first(groups):  # the first batch holds the model a while, as a long one would
        if inference._stats["batches"] == 0:
            time.sleep(MODEL_S)
        return run(groups)

    inference._run_on_model_thread = slow_first
    return inference


def _group(model, text: str):
    encoded = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens).encode(
        TokenizeJob([text]).texts, False
    )
    return [encoded]


async def _timed(inference: InferenceDeployment, group, delay_s: float = 0.0) -> float:
    await asyncio.sleep(delay_s)
    start = time.monotonic()
    answers = await inference.infer(group)
    assert len(answers) == 1 and not isinstance(answers[0], Exception)
    return time.monotonic() - start


def test_a_group_on_an_idle_model_never_waits_for_company(model):
    inference = _inference(model, max_batch_size=8)
    took = asyncio.run(_timed(inference, _group(model, "alone")))
    assert took < MODEL_S + 0.15, took  # the model time, not the 0.9 s window


def test_behind_a_running_batch_a_group_waits_for_company_at_most_the_window(model):
    inference = _inference(model, max_batch_size=8)

    async def scenario() -> list[float]:
        return await asyncio.gather(
            _timed(inference, _group(model, "first")),
            _timed(inference, _group(model, "second"), 0.05),  # finds the first on the model
            _timed(inference, _group(model, "third"), 0.1),  # joins the second's batch
        )

    first, second, third = asyncio.run(scenario())
    assert first < MODEL_S + 0.15, first
    assert WINDOW_S - 0.1 <= second < WINDOW_S + 0.4, second  # the window, honoured and bounded
    assert third < second  # it arrived later and left with it
    assert inference._stats["batches"] == 2 and inference._stats["sequences"] == 3


def test_a_full_batch_behind_a_running_one_leaves_when_the_model_frees(model):
    inference = _inference(model, max_batch_size=2)

    async def scenario() -> list[float]:
        return await asyncio.gather(
            _timed(inference, _group(model, "first")),
            _timed(inference, _group(model, "second"), 0.05),
            _timed(inference, _group(model, "third"), 0.1),  # fills the second's batch: no window
        )

    _, second, third = asyncio.run(scenario())
    assert second < MODEL_S + 0.2 and third < MODEL_S + 0.2, (second, third)
    assert inference._stats["batches"] == 2
