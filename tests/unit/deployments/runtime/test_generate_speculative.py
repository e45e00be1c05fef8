"""Speculative decoding: whatever the proposer, greedy output is exactly the model's own (``model.generate``,
fp32), for GPT-2 and Llama, in concurrent mixes where requests join and leave; sampled output follows the
model's distribution (the rejection rule)."""

from __future__ import annotations

from copy import deepcopy

import pytest
import torch
from transformers import PreTrainedModel

from deployments.config import GenerationConfig, SpeculativeConfig
from deployments.runtime.generate.engine import Engine
from deployments.runtime.generate.sampling import NON_FINITE, Sampler, Sampling
from deployments.runtime.generate.speculative import DraftProposer, NgramProposer, accept
from tests.unit.deployments.runtime.generate_support import (
    Events,
    ModelProbe,
    Req,
    assert_greedy_parity,
    drive,
    flat,
    grouped_copy,
    mixed_requests,
    prompt,
)

DRAFT = SpeculativeConfig(method="draft", draft={"name": "d"}, tokens=3, max_rows=4)
NGRAM = SpeculativeConfig(method="ngram", tokens=4, ngram_max=3, ngram_min=1)


def _engine(model: PreTrainedModel, draft: PreTrainedModel | None, spec: SpeculativeConfig) -> Engine:
    limits = GenerationConfig(max_running=6, prefill_chunk_tokens=32, kv_cache_tokens=4096, speculative=spec)
    proposer = (
        DraftProposer(draft, spec.tokens, limits.kv_cache_tokens)
        if draft is not None
        else NgramProposer(spec.tokens, spec.ngram_max, spec.ngram_min)
    )
    return Engine(model, (), limits, proposer=proposer)


def _other_draft(model: PreTrainedModel) -> PreTrainedModel:
    """A draft that mostly disagrees: the model with its weights perturbed."""
    draft = deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return draft


@pytest.mark.parametrize("proposer", ["same-model", "other-model", "ngram"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_parity_whatever_the_proposer(
    arch: str, proposer: str, request: pytest.FixtureRequest
) -> None:
    """Ten requests joining and leaving at different steps (more than ``max_rows`` at times: plain steps
    between speculative ones), with a draft that always agrees, one that rarely does, or prompt lookup."""
    model: PreTrainedModel = request.getfixturevalue(arch)
    runs = grouped_copy(model)
    draft = {"same-model": grouped_copy(model), "other-model": _other_draft(model), "ngram": None}[proposer]
    engine = _engine(runs, draft, NGRAM if draft is None else DRAFT)
    events = Events()
    plan = mixed_requests()
    repeats = prompt(6, seed=77) * 5  # a prompt that repeats itself: prompt lookup has something to find
    plan[1] = [Req("rep", repeats, 20)]
    drive(engine, events, plan)
    assert_greedy_parity(model, events, flat(plan))
    spec = engine.stats().spec
    assert spec is not None and spec.checks > 0 and spec.proposed > 0
    if proposer == "same-model":  # it always agrees: every proposal that fits is kept
        assert spec.accepted / spec.proposed > 0.9
        assert spec.tokens / spec.checks > 2.5
    assert engine.stats().kv_slots_used == 0 and engine.stats().running == 0


def test_a_check_is_one_pass_of_the_model(gpt2: PreTrainedModel) -> None:
    """A draft that always agrees: 13 tokens take a prefill and 3 checks of 4 tokens, not 13 passes."""
    probe = ModelProbe(grouped_copy(gpt2))
    engine = _engine(probe, grouped_copy(gpt2), DRAFT)  # type: ignore[arg-type]
    events = Events()
    req = Req("one", prompt(10, seed=5), 13)
    drive(engine, events, {0: [req]})
    assert_greedy_parity(gpt2, events, [req])
    assert (len(probe.passes), probe.decodes) == (1, 3)


def test_ngram_proposals() -> None:
    lookup = NgramProposer(tokens=3, ngram_max=3, ngram_min=1)
    assert lookup.propose([[1, 2, 3, 4, 5, 1, 2, 3]]) == [[4, 5, 1]]  # the 3-gram 1 2 3 seen before
    assert lookup.propose([[7, 8, 9, 7]]) == [[8, 9, 7]]  # only the 1-gram 7
    assert lookup.propose([[5, 6, 7]]) == [[]]  # nothing repeats
    assert lookup.propose([[1, 2, 9, 1, 2, 8, 1, 2]]) == [[8, 1, 2]]  # the latest occurrence
    # Token ids whose bytes match across a token boundary are not a match.
    assert NgramProposer(2, 1, 1).propose([[256, 1, 0, 1]]) == [[0, 1]]


def test_greedy_acceptance_keeps_the_agreeing_run_then_the_models_token() -> None:
    vocab = 6
    logits = torch.full((2, 4, vocab), -5.0)
    for row, best in enumerate([[1, 2, 3, 4], [5, 5, 5, 5]]):
        for j, b in enumerate(best):
            logits[row, j, b] = 5.0
    greedy = [Sampler(Sampling()), Sampler(Sampling())]
    # Row 0 agrees twice then differs; row 1 differs at once.
    assert accept(logits, [[1, 2, 0], [0, 0, 0]], [3, 3], greedy) == [[1, 2, 3], [5]]
    # A row's room caps what it keeps: then the model's token at that position.
    assert accept(logits, [[1, 2, 3], [5, 5, 5]], [1, 3], greedy) == [[1, 2], [5, 5, 5, 5]]
    logits[1, 2, 0] = float("nan")
    assert accept(logits, [[1, 2, 3], [5, 5, 5]], [3, 3], greedy) == [[1, 2, 3, 4], [NON_FINITE]]


def test_sampled_acceptance_follows_the_models_distribution() -> None:
    """Whatever the proposal, the first token given is distributed as the model's own (temperature 1)."""
    target = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = torch.log(target.clamp_min(1e-12))[None, None, :].expand(1, 2, 4).clone()
    sampler = Sampler(Sampling(temperature=1.0, seed=3))
    counts = torch.zeros(4)
    draws = 6000
    for _ in range(draws):
        counts[accept(logits, [[1]], [1], [sampler])[0][0]] += 1
    assert torch.allclose(counts / draws, target, atol=0.02), counts / draws
