"""Short prompts waiting together are prefilled in one pass (``prefill_pack_tokens``), each attending over
its own tokens only: a burst costs one pass, and every prompt still gets ``model.generate``'s tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from deployments.config import GenerationConfig
from deployments.runtime.generate.engine import Engine
from deployments.runtime.generate.passes import can_pack, prefill_pack, prefill_piece
from tests.unit.deployments.runtime.generate_support import (
    Events,
    ModelProbe,
    Req,
    assert_greedy_parity,
    grouped_copy,
    prompt,
    step,
    submit,
)

BURST = (5, 9, 12, 7, 16)  # prompt lengths, all at most a chunk (16); the first four are 33 tokens


@pytest.mark.parametrize(
    ("runs_on", "pack_tokens", "prefilled_first", "passes_first"),
    [
        ("service", 48, 4, [33]),  # 5 + 9 + 12 + 7 in one pass; the 16 would pass 48
        ("service", 64, 5, [49]),  # the whole burst
        ("service", 16, 2, [5, 9, 2]),  # packing off (not above a chunk): a pass per prompt
        ("as-loaded", 64, 2, [5, 9, 2]),  # without row-group attention nothing keeps packed prompts apart
    ],
)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_burst_of_short_prompts_shares_one_pass(
    arch: str,
    runs_on: str,
    pack_tokens: int,
    prefilled_first: int,
    passes_first: list[int],
    request: pytest.FixtureRequest,
) -> None:
    model: PreTrainedModel = request.getfixturevalue(arch)
    runs = ModelProbe(grouped_copy(model) if runs_on == "service" else model)
    limits = GenerationConfig(max_running=8, prefill_chunk_tokens=16, prefill_pack_tokens=pack_tokens)
    engine = Engine(runs, (), limits)  # type: ignore[arg-type]
    events = Events()
    reqs = [Req(f"p{i}", prompt(n, seed=900 + i), 4 + i) for i, n in enumerate(BURST)]
    submit(engine, events, reqs)
    step(engine)  # prefill, then a decode step of whatever joined
    assert runs.passes == passes_first
    started = [r.request_id for r in reqs if events.tokens(r.request_id)]
    assert started == [r.request_id for r in reqs[:prefilled_first]]
    assert all(len(events.tokens(r)) == 2 for r in started)  # the pass's token and the step's
    while step(engine):
        pass
    assert_greedy_parity(model, events, reqs)
    assert engine.stats().running == engine.stats().waiting == engine.stats().kv_slots_used == 0


def test_a_long_prompt_is_not_packed_and_keeps_its_chunks(gpt2: PreTrainedModel) -> None:
    """A prompt longer than a chunk is prefilled alone, a chunk an iteration, as before; whole short prompts
    behind it wait their turn (first come, first prefilled)."""
    engine = Engine(grouped_copy(gpt2), (), GenerationConfig(max_running=8, prefill_chunk_tokens=16))
    events = Events()
    reqs = [
        Req("long", prompt(40, seed=950), 3),
        Req("s1", prompt(6, seed=951), 3),
        Req("s2", prompt(5, seed=952), 3),
    ]
    submit(engine, events, reqs)
    firsts = []
    for _ in range(4):
        step(engine)
        firsts.append([r.request_id for r in reqs if events.tokens(r.request_id)])
    # 16 + 16 of the long prompt, then its last 8 with s1 (6) alone after it, then s2
    assert firsts[:3] == [[], [], ["long", "s1"]]
    while step(engine):
        pass
    assert_greedy_parity(gpt2, events, reqs)


def test_a_packed_pass_gives_each_prompt_what_it_gets_alone(gpt2: PreTrainedModel) -> None:
    """The model's own numbers: logits and cache of prompts laid end to end, against each prompt alone."""
    model = grouped_copy(gpt2)
    assert can_pack(model) and not can_pack(gpt2)
    prompts = [prompt(n, seed=970 + n) for n in (3, 11, 7)]
    with torch.inference_mode():
        logits, cache, starts = prefill_pack(model, prompts)
        assert starts == [0, 3, 14]
        for i, (p, start) in enumerate(zip(prompts, starts, strict=True)):
            alone = DynamicCache(config=model.config)
            torch.testing.assert_close(logits[i : i + 1], prefill_piece(model, p, 0, len(p), alone))
            for packed_layer, alone_layer in zip(cache.layers, alone.layers, strict=True):
                for packed, own in (
                    (packed_layer.keys, alone_layer.keys),
                    (packed_layer.values, alone_layer.values),
                ):
                    torch.testing.assert_close(packed[0, :, start : start + len(p)], own[0])
