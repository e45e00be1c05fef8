"""The continuous-batching engine on tiny random causal LMs, driven step by step (no Ray, no threads).

The reference is ``model.generate`` for each prompt alone: whatever shares the batch, whenever a request
joins, however its prompt is chunked, a greedy request gets exactly those tokens.
"""

from __future__ import annotations

import time

import pytest
from transformers import (
    PreTrainedModel,
)

from deployments.config import GenerationConfig
from deployments.runtime.generate import row_attention
from deployments.runtime.generate.engine import Engine
from deployments.runtime.generate.sampling import Sampling
from tests.unit.deployments.runtime.generate_support import (  # noqa: F401 - fixtures
    GREEDY,
    SAMPLED,
    VOCAB,
    Events,
    Req,
    assert_greedy_parity,
    drive,
    flat,
    grouped_copy,
    mixed_requests,
    packed_copy,
    prompt,
    reference,
    step,
    submit,
)


@pytest.mark.parametrize("runs_on", ["as-loaded", "packed", "service"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_parity_with_generate(
    arch: str, runs_on: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine on the model as loaded, on oneDNN's packed weights, or as the service runs it (packed,
    decode attention by groups of rows: here as many groups as the lengths allow); the reference is always
    ``model.generate`` on the model as loaded."""
    model: PreTrainedModel = request.getfixturevalue(arch)
    variants = {
        "as-loaded": lambda: model,
        "packed": lambda: packed_copy(model),
        "service": lambda: grouped_copy(model),
    }
    if runs_on == "service":
        monkeypatch.setattr(row_attention, "CALL_COST", 0)
    runs = variants[runs_on]()
    engine = Engine(runs, (), GenerationConfig(max_running=4, prefill_chunk_tokens=16, kv_cache_tokens=4096))
    events = Events()
    plan = mixed_requests()
    waited = False
    i = 0
    while True:  # drive(), watching the queue: with 4 rows, some requests wait for others to finish
        submit(engine, events, plan.get(i, []))
        busy = step(engine)
        waited |= engine.stats().waiting > 0 and engine.stats().running > 0
        i += 1
        if not busy and i > max(plan):
            break
        assert i < 300
    assert waited
    assert_greedy_parity(model, events, flat(plan))
    assert engine.stats().running == engine.stats().waiting == engine.stats().kv_slots_used == 0


# ---- 2. batch composition ----


def test_batch_composition_does_not_change_results(gpt2: PreTrainedModel) -> None:
    target = Req("x", prompt(20, seed=100), 8)
    limits = GenerationConfig(max_running=3, prefill_chunk_tokens=16)
    outputs = []
    mixes: list[dict[int, list[Req]]] = [
        {0: [target]},
        {0: [Req("a", prompt(3, seed=101), 12), target, Req("b", prompt(40, seed=102), 5)]},
        {0: [Req("c", prompt(9, seed=103), 2)], 2: [Req("d", prompt(70, seed=104), 9), target]},
    ]
    for plan in mixes:
        events = Events()
        drive(Engine(gpt2, (), limits), events, plan)
        assert events.final("x").finish == "length"
        outputs.append(events.tokens("x"))
    assert outputs[0] == outputs[1] == outputs[2] == reference(gpt2, target.prompt, 8)


# ---- 3. end of sequence ----


def test_eos_stops_with_finish_stop(gpt2: PreTrainedModel) -> None:
    reqs = [Req(f"e{i}", prompt(6 + 5 * i, seed=200 + i), 12) for i in range(3)]
    greedy = reference(gpt2, reqs[0].prompt, 12)
    k = next(k for k in range(3, 12) if greedy[k] not in greedy[:k])  # its first time at step k >= 3
    eos = greedy[k]
    events = Events()
    drive(Engine(gpt2, (eos, VOCAB + 7), GenerationConfig(max_running=4)), events, {0: reqs})
    assert events.tokens("e0") == greedy[: k + 1]  # the eos token is the last one sent
    final = events.final("e0")
    assert (final.token_id, final.finish, final.error) == (eos, "stop", None)
    for r in reqs[1:]:  # the others stop at their own first eos, if they make one
        ref = reference(gpt2, r.prompt, 12)
        expected = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert events.tokens(r.request_id) == expected
        assert events.final(r.request_id).finish == ("stop" if eos in ref else "length")


def test_eos_as_the_first_token(gpt2: PreTrainedModel) -> None:
    p = prompt(7, seed=300)
    first = reference(gpt2, p, 1)[0]
    events = Events()
    engine = Engine(gpt2, (first,), GenerationConfig())
    drive(engine, events, {0: [Req("f", p, 10)]})
    assert events.tokens("f") == [first]
    assert events.final("f").finish == "stop"
    assert engine.stats().kv_slots_used == 0


# ---- 4. seeded sampling ----


def test_seeded_sampling_is_reproducible(gpt2: PreTrainedModel) -> None:
    p = prompt(10, seed=400)
    n = 24
    limits = GenerationConfig(max_running=4, prefill_chunk_tokens=16)

    def sampled(plan: dict[int, list[Req]], request_id: str = "s7") -> list[int]:
        events = Events()
        drive(Engine(gpt2, (), limits), events, plan)
        assert events.final(request_id).finish == "length"
        return events.tokens(request_id)

    alone = sampled({0: [Req("s7", p, n, SAMPLED)]})
    assert alone == sampled({0: [Req("s7", p, n, SAMPLED)]})  # twice
    events = Events()
    mix = {
        0: [Req("g", prompt(30, seed=401), 6), Req("s8", p, n, Sampling(0.8, 0.9, seed=8))],
        1: [Req("s7", p, n, SAMPLED), Req("tiny", p, n, Sampling(0.8, 1e-6, seed=9))],
        3: [Req("g2", prompt(45, seed=402), 20)],
    }
    drive(Engine(gpt2, (), limits), events, mix)
    assert events.tokens("s7") == alone  # in a mix, joining at another step
    other_seed = events.tokens("s8")
    assert len(other_seed) == n and other_seed != alone
    assert events.tokens("tiny") == reference(gpt2, p, n)  # top_p ~0 keeps only the argmax
    greedy = reference(gpt2, p, n)
    assert alone != greedy
    assert_greedy_parity(gpt2, events, [mix[0][0], mix[3][0]])


# ---- 5. cancellation ----


def test_thread_mode(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), GenerationConfig(max_running=3, prefill_chunk_tokens=16))
    events = Events()
    reqs = [r for r in flat(mixed_requests()) if r.max_new <= 10][:5]
    engine.start()
    try:
        submit(engine, events, reqs[:3])
        time.sleep(0.05)
        submit(engine, events, reqs[3:])
        deadline = time.monotonic() + 30
        while not all(events.done(r.request_id) for r in reqs):
            assert time.monotonic() < deadline, "no final events within 30 s"
            time.sleep(0.01)
        assert engine.alive
    finally:
        engine.stop()
    assert not engine.alive
    assert_greedy_parity(gpt2, events, reqs)
