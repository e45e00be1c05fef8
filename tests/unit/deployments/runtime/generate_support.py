"""Tiny random causal LMs and a step-by-step driver for the engine's tests (test_generate_*.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from copy import deepcopy
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

from deployments.runtime.generate.engine import Engine, TokenEvent
from deployments.runtime.generate.row_attention import use_row_groups
from deployments.runtime.generate.sampling import Sampling
from deployments.runtime.packed_linear import pack_linears

VOCAB = 500
GREEDY = Sampling()
SAMPLED = Sampling(temperature=0.8, top_p=0.9, seed=7)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads; on a busy shared CPU they spin and run 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gpt2(one_thread: None) -> PreTrainedModel:
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
def llama(one_thread: None) -> PreTrainedModel:
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


def packed_copy(model: PreTrainedModel) -> PreTrainedModel:
    """The model with its linear layers on oneDNN's packed weights, as the service's engine runs it."""
    copy = deepcopy(model)
    assert pack_linears(copy) > 0, "this PyTorch build cannot pack the linear layers"
    return copy


def grouped_copy(model: PreTrainedModel, packed: bool = True) -> PreTrainedModel:
    """The model with decode attention by groups of rows, on packed weights (``packed``: as the service's
    engine runs it)."""
    copy = packed_copy(model) if packed else deepcopy(model)
    assert use_row_groups(copy), "the model could not switch to grouped decode attention"
    return copy


class ModelProbe(torch.nn.Module):
    """The model as the engine sees it, noting each prefill pass's tokens and counting decode calls (the
    engine's prefill keeps some logits, a decode step all); ``run`` is where a subclass breaks a pass."""

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self.passes: list[int] = []
        self.decodes = 0

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    def forward(self, **kwargs: Any) -> Any:
        prefill = "logits_to_keep" in kwargs
        if prefill:
            self.passes.append(int(kwargs["input_ids"].shape[1]))
        else:
            self.decodes += 1
        return self.run(prefill, **kwargs)

    def run(self, prefill: bool, **kwargs: Any) -> Any:
        return self.model(**kwargs)


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
    # The memory the batch holds, not only what admission counts, stays within the budget.
    assert stats.kv_slots_filled <= stats.kv_slots_allocated <= limits.kv_cache_tokens
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
