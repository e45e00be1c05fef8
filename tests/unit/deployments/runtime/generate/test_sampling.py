"""Sampling draws on the logits' device: it works there, stays there, repeats with a seed and keeps to
top_p and temperature. Runs on every device this machine has (the CPU, and CUDA where there is one)."""

from __future__ import annotations

import pytest
import torch

from deployments.runtime.generate.sampling import Sampler, Sampling, draw, next_tokens

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
VOCAB = 64


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


def _logits(device: torch.device, rows: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g).to(device)


def _run(logits: torch.Tensor, sampling: Sampling, steps: int = 20) -> list[int]:
    sampler = Sampler(sampling)
    return [next_tokens(logits[:1], [sampler])[0] for _ in range(steps)]


def test_a_draw_works_and_stays_on_the_logits_device(device: torch.device) -> None:
    logits = _logits(device)
    sampler = Sampler(Sampling(temperature=0.8, top_p=0.9, seed=3))
    token = draw(logits[0], sampler)
    assert token.device.type == device.type and token.dim() == 0
    assert sampler.generator is not None and sampler.generator.device.type == device.type
    nucleus = Sampler(Sampling(temperature=1.0, seed=3))
    assert draw(logits[0], nucleus).device.type == device.type  # the path without top_p too
    for dtype in (torch.float16, torch.bfloat16):  # half-precision logits, as a half model gives
        assert 0 <= int(draw(logits[0].to(dtype), Sampler(Sampling(0.7, 0.95, seed=1)))) < VOCAB


def test_a_seed_repeats_and_other_seeds_differ(device: torch.device) -> None:
    logits = _logits(device)
    first = _run(logits, Sampling(temperature=1.0, seed=11))
    assert first == _run(logits, Sampling(temperature=1.0, seed=11))
    assert len(set(first)) > 1, "a sampled stream that never varies is not sampling"
    assert first != _run(logits, Sampling(temperature=1.0, seed=12))
    # A request's stream continues from step to step: not one draw repeated.
    sampler = Sampler(Sampling(temperature=1.0, seed=11))
    assert [int(draw(logits[0], sampler)) for _ in range(20)] == first


def test_greedy_and_sampled_rows_share_a_batch(device: torch.device) -> None:
    logits = _logits(device, rows=3)
    samplers = [Sampler(Sampling()), Sampler(Sampling(1.0, seed=5)), Sampler(Sampling())]
    tokens = next_tokens(logits, samplers)
    argmax = logits.argmax(-1).tolist()
    assert tokens[0] == argmax[0] and tokens[2] == argmax[2]
    assert all(isinstance(t, int) for t in tokens)
    assert samplers[0].generator is None  # greedy rows draw nothing


def test_top_p_keeps_to_the_nucleus(device: torch.device) -> None:
    # Three tokens hold 0.5, 0.3 and 0.2 of the mass: top_p 0.6 keeps the first two, 1e-6 only the first.
    probs = torch.full((VOCAB,), 1e-9)
    probs[[7, 21, 40]] = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log().to(device)
    kept = {int(draw(logits, Sampler(Sampling(1.0, 0.6, seed=s)))) for s in range(200)}
    assert kept == {7, 21}
    assert {int(draw(logits, Sampler(Sampling(1.0, 1e-6, seed=s)))) for s in range(50)} == {7}
    assert {7, 21, 40} <= {int(draw(logits, Sampler(Sampling(1.0, 1.0, seed=s)))) for s in range(300)}


def test_temperature_sharpens_and_flattens(device: torch.device) -> None:
    logits = torch.zeros(VOCAB)
    logits[9] = 2.0
    logits = logits.to(device)

    def share_of_top(temperature: float) -> float:
        sampler = Sampler(Sampling(temperature, seed=2))
        return sum(int(draw(logits, sampler)) == 9 for _ in range(400)) / 400

    cold, warm = share_of_top(0.05), share_of_top(5.0)
    assert cold == 1.0  # e^(2/0.05) against 63 others: the argmax every time
    assert warm < 0.1  # near uniform over 64 tokens (1/64 each, 0.024 for the top at t=5)
