"""The continuous-batching engine on tiny random causal LMs, driven step by step (no Ray, no threads).

The reference is ``model.generate`` for each prompt alone: whatever shares the batch, whenever a request
joins, however its prompt is chunked, a greedy request gets exactly those tokens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)

from deployments.runtime.generate.engine import Engine, EngineFullError, EngineLimits, TokenEvent
from deployments.runtime.generate.sampling import Sampling

VOCAB = 500
GREEDY = Sampling()
SAMPLED = Sampling(temperature=0.8, top_p=0.9, seed=7)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads; on a busy shared CPU they spin and run 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gpt2() -> PreTrainedModel:
    torch.manual_seed(0)
    # initializer_range 0.2: at the default 0.02 a tied-embedding GPT-2 just repeats its last input token,
    # which would hide a wrong cache, mask or position behind identical outputs.
    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=256,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def llama() -> PreTrainedModel:
    torch.manual_seed(1)
    config = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: the cache has fewer heads than the queries
        vocab_size=VOCAB,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


# ---- references and helpers ----

_REFERENCE: dict[tuple[int, tuple[int, ...]], list[int]] = {}


def reference(model: PreTrainedModel, prompt: list[int], n: int) -> list[int]:
    """``model.generate`` greedy for ``prompt`` alone, exactly ``n`` new tokens (memoised by prefix)."""
    key = (id(model), tuple(prompt))
    known = _REFERENCE.get(key, [])
    if len(known) < n:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        known = _REFERENCE[key] = out[0, len(prompt) :].tolist()
    return known[:n]


def prompt(length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (length,), generator=g).tolist()


class Events:
    """A sink for every request (thread-safe), with the checks every request's stream must pass."""

    def __init__(self) -> None:
        self.all: list[TokenEvent] = []
        self._lock = threading.Lock()

    def __call__(self, event: TokenEvent) -> None:
        with self._lock:
            self.all.append(event)

    def of(self, request_id: str) -> list[TokenEvent]:
        with self._lock:
            return [e for e in self.all if e.request_id == request_id]

    def tokens(self, request_id: str) -> list[int]:
        return [e.token_id for e in self.of(request_id) if e.token_id is not None]

    def final(self, request_id: str) -> TokenEvent:
        """Its one final event, which is its last event."""
        events = self.of(request_id)
        finals = [e for e in events if e.finish is not None]
        assert len(finals) == 1, f"{request_id}: {len(finals)} final events"
        assert events[-1] is finals[0], f"{request_id}: events after its final one"
        return finals[0]

    def done(self, request_id: str) -> bool:
        return any(e.finish is not None for e in self.of(request_id))


@dataclass(frozen=True)
class Req:
    request_id: str
    prompt: list[int]
    max_new: int
    sampling: Sampling = GREEDY


def submit(engine: Engine, events: Events, reqs: Iterable[Req]) -> None:
    for r in reqs:
        engine.submit(r.request_id, r.prompt, r.max_new, r.sampling, events)


def step(engine: Engine) -> bool:
    """One ``step()``, then the invariants that hold after any step."""
    with torch.inference_mode():
        busy = engine.step()
    stats = engine.stats()
    limits = engine.limits
    assert stats.kv_slots_used <= limits.kv_cache_tokens == stats.kv_slots_total
    assert stats.running <= limits.max_running
    return busy


def drive(engine: Engine, events: Events, plan: dict[int, list[Req]], max_steps: int = 300) -> int:
    """Submit ``plan[i]`` before step ``i``; step until nothing is left. The number of steps."""
    i = 0
    while True:
        submit(engine, events, plan.get(i, []))
        busy = step(engine)
        i += 1
        if not busy and i > max(plan, default=0):
            return i
        assert i < max_steps, "the engine did not finish"


def assert_greedy_parity(model: PreTrainedModel, events: Events, reqs: Iterable[Req]) -> None:
    for r in reqs:
        final = events.final(r.request_id)
        assert final.finish == "length", (r.request_id, final)
        assert events.tokens(r.request_id) == reference(model, r.prompt, r.max_new), r.request_id


def mixed_requests() -> dict[int, list[Req]]:
    """Ten requests, prompts of 1..80 tokens, 1..30 new tokens, arriving at different steps."""
    shapes = {  # step: [(prompt length, max_new)]
        0: [(5, 6), (80, 3), (1, 8), (33, 1)],
        2: [(12, 30)],
        3: [(3, 4)],
        5: [(50, 7)],
        8: [(16, 2), (24, 10)],
        12: [(64, 3)],
    }
    plan: dict[int, list[Req]] = {}
    n = 0
    for at, pairs in shapes.items():
        for length, new in pairs:
            plan.setdefault(at, []).append(Req(f"r{n}", prompt(length, seed=n), new))
            n += 1
    return plan


def flat(plan: dict[int, list[Req]]) -> list[Req]:
    return [r for reqs in plan.values() for r in reqs]


# ---- 1. greedy parity ----


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_parity_with_generate(arch: str, request: pytest.FixtureRequest) -> None:
    model: PreTrainedModel = request.getfixturevalue(arch)
    engine = Engine(model, (), EngineLimits(max_running=4, prefill_chunk_tokens=16, kv_cache_tokens=4096))
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
    limits = EngineLimits(max_running=3, prefill_chunk_tokens=16)
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
    drive(Engine(gpt2, (eos, VOCAB + 7), EngineLimits(max_running=4)), events, {0: reqs})
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
    engine = Engine(gpt2, (first,), EngineLimits())
    drive(engine, events, {0: [Req("f", p, 10)]})
    assert events.tokens("f") == [first]
    assert events.final("f").finish == "stop"
    assert engine.stats().kv_slots_used == 0


# ---- 4. seeded sampling ----


def test_seeded_sampling_is_reproducible(gpt2: PreTrainedModel) -> None:
    p = prompt(10, seed=400)
    n = 24
    limits = EngineLimits(max_running=4, prefill_chunk_tokens=16)

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


def test_cancel_leaves_within_one_step(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), EngineLimits(max_running=4, prefill_chunk_tokens=64))
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
    slots = engine.stats().kv_slots_used
    engine.cancel("c3")  # the longest row: its leaving frees columns too
    step(engine)
    final = events.final("c3")
    assert final.finish == "cancelled" and final.token_id is None and final.cancel_lag_steps == 0
    assert len(events.tokens("c3")) == made  # no token after the cancel
    assert events.tokens("c3") == reference(gpt2, running[3].prompt, made)
    after = engine.stats()
    assert after.running == 3
    assert after.kv_slots_used < slots
    # Exactly rows x the longest cache left (prompt + tokens fed back): the padding columns were cut.
    cached = [len(r.prompt) + len(events.tokens(r.request_id)) - 1 for r in running[:3]]
    assert after.kv_slots_used == 3 * max(cached)
    engine.cancel("c3")  # again, after it left: harmless
    while step(engine):
        pass
    assert_greedy_parity(gpt2, events, running[:3])
    assert engine.stats().kv_slots_used == 0


def test_cancel_while_prefilling(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), EngineLimits(max_running=4, prefill_chunk_tokens=16))
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
    engine = Engine(gpt2, (), EngineLimits(max_running=2))
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


def test_submit_refuses_what_cannot_fit(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), EngineLimits(kv_cache_tokens=64, max_waiting=2))
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
    limits = EngineLimits(max_running=4, kv_cache_tokens=64, prefill_chunk_tokens=16)
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


# ---- 7. chunked prefill ----


def test_chunked_prefill_does_not_stall_running_streams(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), EngineLimits(max_running=4, prefill_chunk_tokens=16))
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


class FailingDecode(torch.nn.Module):
    """The model, but its ``fail_on``-th decode call (1-based) raises."""

    def __init__(self, model: PreTrainedModel, fail_on: int) -> None:
        super().__init__()
        self.model = model
        self.fail_on = fail_on
        self.decodes = 0

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    def forward(self, **kwargs: Any) -> Any:
        if "logits_to_keep" not in kwargs:  # the engine's prefill keeps one logit; decode keeps all
            self.decodes += 1
            if self.decodes == self.fail_on:
                raise RuntimeError("boom in decode")
        return self.model(**kwargs)


def test_a_failing_decode_fails_only_its_requests(gpt2: PreTrainedModel) -> None:
    flaky = FailingDecode(gpt2, fail_on=2)
    engine = Engine(flaky, (), EngineLimits(max_running=4, prefill_chunk_tokens=16))  # type: ignore[arg-type]
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
    assert (stats.running, stats.waiting, stats.kv_slots_used) == (0, 1, 0)
    after = Req("after", prompt(9, seed=803), 6)
    submit(engine, events, [after])
    while step(engine):
        pass
    assert_greedy_parity(gpt2, events, [prefilling, after])
    assert flaky.decodes > 2


class FailingPrefill(torch.nn.Module):
    """The model, but a prefill of a prompt starting with ``poison`` raises, or gives NaN logits."""

    def __init__(self, model: PreTrainedModel, poison: int, nan: bool = False) -> None:
        super().__init__()
        self.model = model
        self.poison = poison
        self.nan = nan

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    def forward(self, **kwargs: Any) -> Any:
        poisoned = "logits_to_keep" in kwargs and int(kwargs["input_ids"][0, 0]) == self.poison
        if poisoned and not self.nan:
            raise RuntimeError("boom in prefill")
        out = self.model(**kwargs)
        if poisoned:
            out.logits.fill_(float("nan"))
        return out


@pytest.mark.parametrize("nan", [False, True], ids=["raises", "nan-logits"])
def test_a_failing_prefill_fails_only_its_prompt(gpt2: PreTrainedModel, nan: bool) -> None:
    """The prompt in the failing pass gets its error; the running batch and the prompts behind go on."""
    flaky = FailingPrefill(gpt2, poison=VOCAB - 1, nan=nan)
    engine = Engine(flaky, (), EngineLimits(max_running=4, prefill_chunk_tokens=64))  # type: ignore[arg-type]
    events = Events()
    running = Req("running", prompt(5, seed=810), 8)
    bad = Req("bad", [VOCAB - 1, *prompt(9, seed=811)], 4, Sampling(0.8, 1.0, seed=1))
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


# ---- 9. the engine's own thread ----


def test_thread_mode(gpt2: PreTrainedModel) -> None:
    engine = Engine(gpt2, (), EngineLimits(max_running=3, prefill_chunk_tokens=16))
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
