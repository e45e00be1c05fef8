"""Prefix caching: prompts that share leading blocks prefill only the rest, and every greedy request still
gets ``model.generate``'s tokens for its prompt alone (fp32), for GPT-2 and Llama, alone or in packs."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from deployments.config import GenerationConfig
from deployments.runtime.generate.engine import Engine
from deployments.runtime.generate.kv_batch import PromptLayer
from deployments.runtime.generate.prefix_cache import PrefixCache
from tests.unit.deployments.runtime.generate_support import (
    Events,
    ModelProbe,
    Req,
    assert_greedy_parity,
    drive,
    grouped_copy,
    prompt,
)

SYSTEM = prompt(70, seed=900)  # a shared "system prompt": 4 whole blocks of 16, and 6 tokens more


def _shared(n: int, seed: int, turn: int = 7) -> list[Req]:
    return [Req(f"s{seed}-{i}", SYSTEM + prompt(turn + i, seed=seed + i), 6) for i in range(n)]


@pytest.mark.parametrize("packs", [False, True], ids=["alone", "packed"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_cached_prefix_gives_the_cold_tokens(
    arch: str, packs: bool, request: pytest.FixtureRequest
) -> None:
    """Requests with the same system prompt, arriving together and later, in a mix with unrelated ones:
    the later ones prefill only their own tokens, and every one gets the reference tokens."""
    model: PreTrainedModel = request.getfixturevalue(arch)
    probe = ModelProbe(grouped_copy(model) if packs else model)
    limits = GenerationConfig(max_running=6, prefill_chunk_tokens=96, prefill_pack_tokens=512)
    engine = Engine(probe, (), limits)  # type: ignore[arg-type]
    events = Events()
    together = _shared(3, seed=910)  # arrive at once: the first computes the prefix
    unrelated = [Req("u0", prompt(40, seed=920), 5), Req("u1", prompt(9, seed=921), 8)]
    later = _shared(3, seed=930, turn=3)  # minutes later, as far as the cache knows
    drive(engine, events, {0: [*together, *unrelated], 12: later})
    assert_greedy_parity(model, events, [*together, *unrelated, *later])
    # Every later request prefilled only what follows the 64 cached tokens (4 blocks).
    own = [len(r.prompt) - 64 for r in later]
    assert all(n in probe.passes for n in own), (own, probe.passes)
    stats = engine.stats().prefix
    assert stats is not None and stats.hit_tokens >= 64 * len(later)
    assert stats.prompt_tokens == sum(len(r.prompt) for r in [*together, *unrelated, *later])
    assert 0 < stats.blocks_used <= stats.blocks_total


def test_a_request_behind_a_long_shared_prompt_reuses_its_chunks(gpt2: PreTrainedModel) -> None:
    """Two long prompts with one prefix, admitted together and prefilled in chunks: the second starts after
    what the first had stored by then, not from its first token."""
    probe = ModelProbe(gpt2)
    engine = Engine(probe, (), GenerationConfig(prefill_chunk_tokens=32))  # type: ignore[arg-type]
    events = Events()
    reqs = [Req(f"l{i}", SYSTEM + prompt(5, seed=940 + i), 4) for i in range(2)]
    drive(engine, events, {0: reqs})
    assert_greedy_parity(gpt2, events, reqs)
    assert sum(probe.passes) == len(reqs[0].prompt) + len(reqs[1].prompt) - 64


def test_prefix_caching_off(gpt2: PreTrainedModel) -> None:
    probe = ModelProbe(gpt2)
    engine = Engine(probe, (), GenerationConfig(prefix_cache_tokens=0))  # type: ignore[arg-type]
    events = Events()
    reqs = _shared(2, seed=950)
    drive(engine, events, {0: reqs[:1], 3: reqs[1:]})
    assert_greedy_parity(gpt2, events, reqs)
    assert sum(probe.passes) == sum(len(r.prompt) for r in reqs)
    assert engine.stats().prefix is None


# ---- the cache alone ----

HEADS, DIM, LAYERS = 2, 4, 3


def _cache_of(tokens: list[int]) -> DynamicCache:
    """A one-row cache whose every key and value is its token id (so a block's content names its tokens)."""
    cache = DynamicCache()
    t = torch.tensor(tokens, dtype=torch.float32)[None, None, :, None].expand(1, HEADS, len(tokens), DIM)
    for layer in range(LAYERS):
        cache.update(t.clone(), -t.clone(), layer)
    return cache


def _hit(cache: PrefixCache, prompt: list[int]) -> tuple[int, DynamicCache]:
    into = DynamicCache()
    into.layers[:] = [PromptLayer(len(prompt)) for _ in range(LAYERS)]
    return cache.lookup(prompt, into), into


def test_lookup_stops_at_the_first_block_that_differs() -> None:
    cache = PrefixCache(block_tokens=4, budget_tokens=64)
    first = list(range(1, 14))  # 13 tokens: 3 whole blocks
    cache.store(first, _cache_of(first), len(first))
    other = [*first[:6], 99, *first[7:], 50]  # differs in block 1: only block 0 matches
    hit, kv = _hit(cache, other)
    assert hit == 4
    assert kv.layers[2].keys[0, 0, :, 0].tolist() == [1, 2, 3, 4]
    assert kv.layers[2].values[0, 1, :, 0].tolist() == [-1, -2, -3, -4]
    # The same blocks after another first block are other blocks: keyed by the whole prefix.
    assert _hit(cache, [0, *first])[0] == 0
    # At least one token is left to prefill: 12 cached tokens of a 12-token prompt give 8.
    assert _hit(cache, first[:12])[0] == 8


def test_least_recently_used_leaves_go_first() -> None:
    cache = PrefixCache(block_tokens=2, budget_tokens=8)  # 4 blocks
    a = [1, 2, 3, 4, 5, 6, 0]  # 3 blocks
    cache.store(a, _cache_of(a), 6)
    b = [7, 8, 0]
    cache.store(b, _cache_of(b), 2)  # full: 4 blocks
    assert _hit(cache, a)[0] == 6  # a is now more recent than b
    c = [9, 9, 0]
    cache.store(c, _cache_of(c), 2)  # evicts b, the least recently used
    assert _hit(cache, b)[0] == 0
    assert _hit(cache, a)[0] == 6
    d = [5, 5, 0]
    cache.store(d, _cache_of(d), 2)  # evicts c (a was just used)
    e = [4, 4, 0]
    cache.store(e, _cache_of(e), 2)  # a's leaf (its third block) goes before its parents
    assert _hit(cache, a)[0] == 4
    stats = cache.stats()
    assert stats.blocks_used == stats.blocks_total == 4
