"""The engine's bounds and failures on tiny random causal LMs, driven step by step: cancellation within one
step, bounded admission and KV slots, chunked prefill beside running streams, a failing pass failing only its
own requests."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import (
    PreTrainedModel,
)

from deployments.config import GenerationConfig, SpeculativeConfig
from deployments.runtime.generate.engine import Engine, EngineFullError
from deployments.runtime.generate.sampling import Sampling
from deployments.runtime.generate.speculative import NgramProposer
from tests.unit.deployments.runtime.generate_support import (  # noqa: F401 - fixtures
    GREEDY,
    SAMPLED,
    VOCAB,
    Events,
    ModelProbe,
    Req,
    assert_greedy_parity,
    drive,
    flat,
    grouped_copy,
    mixed_requests,
    prompt,
    reference,
    step,
    submit,
)


def test_cancel_leaves_within_one_step(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), GenerationConfig(max_running=4, prefill_chunk_tokens=64))
    events = Events()
    running = [Req(f"c{i}", prompt(5 + 3 * i, seed=500 + i), 14) for i in range(4)]
    queued = Req("queued", prompt(4, seed=510), 5)
    submit(engine, events, [*running, queued])
    for _ in range(3):
        step(engine)
    before = engine.stats()
    assert (before.running, before.waiting) == (4, 1)

    engine.cancel("queued")  # not admitted yet: leaves the queue
    engine.cancel("nobody")  # unknown: harmless
    step(engine)
    assert events.tokens("queued") == []
    assert events.final("queued").finish == "cancelled"
    assert not events.of("nobody")
    assert (engine.stats().running, engine.stats().waiting) == (4, 0)

    made = len(events.tokens("c3"))
    slots = engine.stats().kv_slots_filled
    engine.cancel("c3")  # the longest row: its leaving frees columns too
    step(engine)
    final = events.final("c3")
    assert final.finish == "cancelled" and final.token_id is None and final.cancel_lag_steps == 0
    assert len(events.tokens("c3")) == made  # no token after the cancel
    assert events.tokens("c3") == reference(gpt2, running[3].prompt, made)
    after = engine.stats()
    assert after.running == 3
    assert after.kv_slots_filled < slots
    # Exactly rows x the longest cache left (prompt + tokens fed back): the padding columns were cut.
    cached = [len(r.prompt) + len(events.tokens(r.request_id)) - 1 for r in running[:3]]
    assert after.kv_slots_filled == 3 * max(cached)
    # What admission counts: the 3 rows left, each at the longest whole generation of the three.
    assert after.kv_slots_used == 3 * max(len(r.prompt) + r.max_new for r in running[:3])
    engine.cancel("c3")  # again, after it left: harmless
    while step(engine):
        pass
    assert_greedy_parity(gpt2, events, running[:3])
    assert engine.stats().kv_slots_used == 0


def test_cancel_while_prefilling(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), GenerationConfig(max_running=4, prefill_chunk_tokens=16))
    events = Events()
    keep, long = Req("keep", prompt(4, seed=520), 8), Req("long", prompt(100, seed=521), 3)
    submit(engine, events, [keep, long])
    for _ in range(3):
        step(engine)
    assert engine.stats().waiting == 1  # "long" is still prefilling
    engine.cancel("long")
    step(engine)
    assert events.final("long").finish == "cancelled" and events.tokens("long") == []
    assert engine.stats().waiting == 0
    while step(engine):
        pass
    assert_greedy_parity(gpt2, events, [keep])


# ---- 6. admission ----


def test_admission_waits_for_a_free_row(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), GenerationConfig(max_running=2))
    events = Events()
    reqs = [
        Req("a", prompt(5, seed=600), 4),
        Req("b", prompt(6, seed=601), 9),
        Req("c", prompt(7, seed=602), 3),
    ]
    submit(engine, events, reqs)
    seen_waiting = 0
    while True:
        c_started, row_free = bool(events.of("c")), events.done("a") or events.done("b")
        if not step(engine):
            break
        stats = engine.stats()
        if not events.of("c"):
            finished = events.done("a") + events.done("b")
            assert (stats.running, stats.waiting) == (2 - finished, 1)
            seen_waiting += 1
        elif not c_started:
            assert row_free  # admitted at the start of the step after a row came free
    assert seen_waiting >= 2
    first_c = events.all.index(events.of("c")[0])
    first_final = min(events.all.index(events.final(r)) for r in ("a", "b"))
    assert first_c > first_final  # "c" started only after "a" or "b" left
    assert_greedy_parity(gpt2, events, reqs)


def test_interactive_requests_are_admitted_first_and_bulk_gets_every_fourth_turn(
    gpt2: PreTrainedModel,
) -> None:
    engine = Engine(gpt2, (), GenerationConfig(max_running=1))
    events = Events()
    engine.submit("bulk-0", prompt(4, seed=700), 1, GREEDY, events, "batch")
    engine.submit("bulk-1", prompt(4, seed=701), 1, GREEDY, events, "batch")
    for i in range(5):
        engine.submit(f"query-{i}", prompt(4, seed=710 + i), 1, GREEDY, events, "interactive")
    while step(engine):
        pass
    order = [e.request_id for e in events.all if e.finish is not None]
    # One row: admissions in order. Interactive first; the 4th admission is a waiting bulk one's.
    assert order == ["query-0", "query-1", "query-2", "bulk-0", "query-3", "query-4", "bulk-1"]


def test_submit_refuses_what_cannot_fit(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), GenerationConfig(kv_cache_tokens=64, max_waiting=2))
    events = Events()
    with pytest.raises(ValueError, match="do not fit"):
        engine.submit("big", prompt(50, seed=610), 15, GREEDY, events)
    with pytest.raises(ValueError):
        engine.submit("empty", [], 4, GREEDY, events)
    with pytest.raises(ValueError):
        engine.submit("none", [1, 2], 0, GREEDY, events)
    engine.submit("exact", prompt(50, seed=610), 14, GREEDY, events)  # 64 fits exactly
    engine.submit("small", prompt(3, seed=611), 2, GREEDY, events)
    with pytest.raises(EngineFullError):
        engine.submit("third", prompt(3, seed=612), 2, GREEDY, events)
    assert engine.stats().waiting == 2
    assert not events.all  # refused requests get no events


def test_kv_slots_never_exceed_the_budget(gpt2: PreTrainedModel) -> None:
    limits = GenerationConfig(max_running=4, kv_cache_tokens=64, prefill_chunk_tokens=16)
    engine = Engine(gpt2, (), limits)
    events = Events()
    plan = {
        0: [Req("k0", prompt(20, seed=620), 10), Req("k1", prompt(4, seed=621), 12)],
        1: [Req("k2", prompt(30, seed=622), 4), Req("k3", prompt(2, seed=623), 6)],
        4: [Req("k4", prompt(9, seed=624), 5)],
    }
    peak = 0
    i = 0
    while True:  # drive() checks kv_slots_used <= 64 after every step
        submit(engine, events, plan.get(i, []))
        busy = step(engine)
        peak = max(peak, engine.stats().kv_slots_used)
        i += 1
        if not busy and i > max(plan):
            break
    assert 0 < peak <= 64
    assert_greedy_parity(gpt2, events, flat(plan))


@pytest.mark.parametrize("speculates", [False, True], ids=["plain", "speculative"])
def test_the_memory_held_never_exceeds_the_budget(gpt2: PreTrainedModel, speculates: bool) -> None:
    """A budget that is no multiple of the buffers' steps (1,120 slots once peaked at 2,048 allocated: rows
    and columns grew with room to spare past it). Every step checks allocated <= budget (``step``)."""
    spec = SpeculativeConfig(method="ngram", tokens=3, ngram_min=1) if speculates else None
    limits = GenerationConfig(max_running=8, kv_cache_tokens=1120, prefill_chunk_tokens=64, speculative=spec)
    proposer = NgramProposer(3, 4, 1) if speculates else None
    engine = Engine(gpt2, (), limits, proposer=proposer)
    events = Events()
    lengths = [(40, 60), (7, 90), (100, 20), (3, 130), (60, 40), (12, 75), (90, 50), (25, 25)]
    plan = {i: [Req(f"m{i}", prompt(n, seed=650 + i), new)] for i, (n, new) in enumerate(lengths)}
    peak = 0
    i = 0
    while True:
        submit(engine, events, plan.get(i, []))
        busy = step(engine)
        peak = max(peak, engine.stats().kv_slots_allocated)
        i += 1
        if not busy and i > max(plan):
            break
    assert 1120 // 2 < peak <= 1120
    assert_greedy_parity(gpt2, events, flat(plan))


# ---- 7. chunked prefill ----


def test_chunked_prefill_does_not_stall_running_streams(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), GenerationConfig(max_running=4, prefill_chunk_tokens=16))
    events = Events()
    short, long = Req("short", prompt(5, seed=700), 20), Req("long", prompt(200, seed=701), 2)
    submit(engine, events, [short])
    step(engine)
    submit(engine, events, [long])
    prefill_steps = 0
    while not events.of("long"):
        made = len(events.tokens("short"))
        step(engine)
        assert len(events.tokens("short")) == made + 1  # one token every step, prefill or not
        prefill_steps += 1
    assert prefill_steps == 13  # ceil(200 / 16)
    while step(engine):
        pass
    assert_greedy_parity(gpt2, events, [short, long])


# ---- 8. a failing forward pass ----


class FailingDecode(ModelProbe):
    """The model, but its ``fail_on``-th decode call (1-based) raises."""

    def __init__(self, model: PreTrainedModel, fail_on: int) -> None:
        super().__init__(model)
        self.fail_on = fail_on

    def run(self, prefill: bool, **kwargs: Any) -> Any:
        if not prefill and self.decodes == self.fail_on:
            raise RuntimeError("boom in decode")
        return self.model(**kwargs)


def test_a_failing_decode_fails_only_its_requests(gpt2: PreTrainedModel) -> None:
    flaky = FailingDecode(gpt2, fail_on=2)
    engine = Engine(flaky, (), GenerationConfig(max_running=4, prefill_chunk_tokens=16))  # type: ignore[arg-type]
    events = Events()
    a, b = Req("a", prompt(5, seed=800), 10), Req("b", prompt(6, seed=801), 10)
    prefilling = Req("p", prompt(64, seed=802), 4)  # four prefill steps: not in the failing decode
    submit(engine, events, [a, b])
    step(engine)  # both prefilled (11 tokens < 16), first decode
    submit(engine, events, [prefilling])
    step(engine)  # the second decode raises
    for r in (a, b):
        final = events.final(r.request_id)
        assert final.finish == "error" and final.token_id is None
        assert final.error == "RuntimeError: boom in decode"
        assert events.tokens(r.request_id) == reference(gpt2, r.prompt, 2)  # what came before stays
    stats = engine.stats()
    # The batch's reservations are gone; the prompt still prefilling keeps its own.
    reserved = len(prefilling.prompt) + prefilling.max_new
    assert (stats.running, stats.waiting, stats.kv_slots_used, stats.kv_slots_filled) == (0, 1, reserved, 0)
    after = Req("after", prompt(9, seed=803), 6)
    submit(engine, events, [after])
    while step(engine):
        pass
    assert_greedy_parity(gpt2, events, [prefilling, after])
    assert flaky.decodes > 2


class FailingPrefill(ModelProbe):
    """The model, but a prefill of a prompt starting with ``poison`` raises, or gives NaN logits."""

    def __init__(self, model: PreTrainedModel, poison: int, nan: bool = False) -> None:
        super().__init__(model)
        self.poison = poison
        self.nan = nan

    def run(self, prefill: bool, **kwargs: Any) -> Any:
        ids = kwargs["input_ids"][0]
        bounds = kwargs.get("prompt_bounds")
        starts = bounds[:-1] if bounds else (0,)
        # Which of the pass's prompts (a pack has several, each with its own logits row) are poisoned.
        poisoned = [i for i, at in enumerate(starts) if prefill and int(ids[at]) == self.poison]
        if poisoned and not self.nan:
            raise RuntimeError("boom in prefill")
        out = self.model(**kwargs)
        for i in poisoned:  # NaN in that prompt's own numbers only, as attention per prompt keeps them
            out.logits[0, i if len(starts) > 1 else -1].fill_(float("nan"))
        return out


@pytest.mark.parametrize("packs", [False, True], ids=["alone", "packed"])
@pytest.mark.parametrize(
    ("nan", "sampling"),
    [(False, SAMPLED), (True, SAMPLED), (True, GREEDY)],
    ids=["raises", "nan-logits-sampled", "nan-logits-greedy"],
)
def test_a_failing_prefill_fails_only_its_prompt(
    gpt2: PreTrainedModel, nan: bool, sampling: Sampling, packs: bool
) -> None:
    """The prompt in the failing pass gets its error; the running batch and the prompts behind go on. Packed
    with the prompt behind it, the failing pass is retried prompt by prompt: only the bad one fails. NaN
    logits are an error too, greedy or sampled (argmax would pick a NaN's index as a token)."""
    flaky = FailingPrefill(grouped_copy(gpt2) if packs else gpt2, poison=VOCAB - 1, nan=nan)
    engine = Engine(flaky, (), GenerationConfig(max_running=4, prefill_chunk_tokens=64))  # type: ignore[arg-type]
    events = Events()
    running = Req("running", prompt(5, seed=810), 8)
    bad = Req("bad", [VOCAB - 1, *prompt(9, seed=811)], 4, sampling)
    behind = Req("behind", prompt(6, seed=812), 5)
    submit(engine, events, [running])
    step(engine)
    submit(engine, events, [bad, behind])  # both admitted; "behind" waits for "bad" in the prefill queue
    while step(engine):
        pass
    final = events.final("bad")
    assert final.finish == "error" and events.tokens("bad") == []
    assert final.error is not None and ("boom in prefill" in final.error or "nan" in final.error)
    assert_greedy_parity(gpt2, events, [running, behind])
    pack = len(bad.prompt) + len(behind.prompt)
    assert (pack in flaky.passes) is packs, flaky.passes  # a pack was tried (and failed) only where it packs


# ---- 9. the engine's own thread ----
