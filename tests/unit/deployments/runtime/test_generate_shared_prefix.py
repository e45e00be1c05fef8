"""A prefix the batch's rows share, held once: cascade attention gives attention over whole rows, the batch
keeps its books (positions, columns, slots, budget), and greedy requests still get ``model.generate``'s
tokens, plain and speculative, for GPT-2 and Llama."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from deployments.config import GenerationConfig, SpeculativeConfig
from deployments.runtime.generate.engine import Engine
from deployments.runtime.generate.kv_batch import KVBatch
from deployments.runtime.generate.shared_prefix import MIN_TOKENS, SharedPrefix, cascade_attention
from deployments.runtime.generate.speculative import NgramProposer
from tests.unit.deployments.runtime.generate_support import (
    Events,
    Req,
    assert_greedy_parity,
    grouped_copy,
    prompt,
    step,
    submit,
)

SYSTEM = prompt(70, seed=700)  # 4 whole blocks of 16 (64 tokens: MIN_TOKENS) are cached, and 6 more
HEADS, KV_HEADS, DIM = 4, 2, 8


class _Layer(torch.nn.Module):
    layer_idx = 0


def _reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """Plain attention of one row (heads, tokens, dim) over its keys (kv heads, columns, dim), float64."""
    groups = q.shape[0] // keys.shape[0]
    k, v = keys.repeat_interleave(groups, 0).double(), values.repeat_interleave(groups, 0).double()
    scores = (q.double() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1)  # (tokens, heads, dim)


@pytest.mark.parametrize("tokens", [1, 3], ids=["decode", "check"])
def test_cascade_attention_is_attention_over_the_whole_rows(tokens: int) -> None:
    """Rows 0 and 2 hold a 20-token prefix once, row 1 does not; rows have other lengths (right padding);
    grouped-query heads. Each row's output is plain attention over its prefix and its own columns."""
    g = torch.Generator().manual_seed(5)
    prefix_k, prefix_v = (torch.randn(KV_HEADS, 20, DIM, generator=g) for _ in range(2))
    lengths, shares = [7, 12, 3], [True, False, True]  # each row's own columns, the new tokens included
    width = max(lengths)
    q = torch.randn(3, HEADS, tokens, DIM, generator=g)
    k, v = (torch.randn(3, KV_HEADS, width, DIM, generator=g) for _ in range(2))
    # The new tokens are each row's last `tokens` columns: each sees its row's earlier ones and itself.
    own = torch.arange(width)[None, None, :]
    last = torch.tensor(lengths)[:, None, None] - tokens + torch.arange(tokens)[None, :, None]
    allowed = own <= last  # (rows, tokens, columns)
    shared = SharedPrefix(list(range(20)), [prefix_k], [prefix_v], torch.tensor(shares))
    out = cascade_attention(_Layer(), q, k, v, allowed[:, None], shared)
    assert out.shape == (3, tokens, HEADS, DIM)
    for r in range(3):
        keys, values, mask = k[r], v[r], allowed[r]
        if shares[r]:
            keys, values = torch.cat([prefix_k, keys], 1), torch.cat([prefix_v, values], 1)
            mask = torch.cat([torch.ones(tokens, 20, dtype=torch.bool), mask], 1)
        want = _reference(q[r], keys, values, mask)
        torch.testing.assert_close(out[r].double(), want, atol=1e-5, rtol=1e-5)


def _cache(prompt_ids: list[int], layers: int = 2) -> DynamicCache:
    """A one-row cache whose key at position p is a function of the token there and everything before."""
    cache = DynamicCache()
    tags = torch.tensor(prompt_ids, dtype=torch.float32).cumsum(0)
    for layer in range(layers):
        keys = (tags + layer)[None, None, :, None].expand(1, KV_HEADS, len(prompt_ids), DIM).clone()
        cache.update(keys, -keys, layer)
    return cache


def _add(batch: KVBatch, ids: list[int], hit: int = 0) -> None:
    batch.add(_cache(ids), len(ids), prompt=ids, hit=hit)


def test_a_batch_holds_a_popular_prefix_once_and_drops_it_with_its_last_row() -> None:
    system = prompt(MIN_TOKENS, seed=701)
    batch = KVBatch()
    _add(batch, [*system, 1, 2], hit=MIN_TOKENS)  # a prefix-cache hit: it becomes the batch's
    _add(batch, [*system, 3, 4, 5])  # starts with it: shares it, hit or not
    _add(batch, prompt(9, seed=702))  # another prompt: a whole row
    assert batch.shared is not None and batch.shared.tokens == system
    assert batch.offsets == [MIN_TOKENS, MIN_TOKENS, 0]
    assert batch.lengths == [MIN_TOKENS + 2, MIN_TOKENS + 3, 9] and batch.stored == [2, 3, 9]
    assert batch.columns == 9 and batch.longest == MIN_TOKENS + 3
    assert batch.slots == 3 * 9 + MIN_TOKENS <= batch.allocated
    # The shared rows' columns are their tokens after the prefix: the same numbers as their own caches'.
    assert batch.cache is not None
    whole = _cache([*system, 3, 4, 5]).layers[1].keys[0]
    torch.testing.assert_close(batch.cache.layers[1].keys[1, :, :3], whole[:, MIN_TOKENS:])
    torch.testing.assert_close(batch.shared.keys[1], whole[:, :MIN_TOKENS])
    # A step: positions from the whole lengths, new columns after each row's stored part.
    mask, positions = batch.step_inputs()
    assert positions.flatten().tolist() == [MIN_TOKENS + 2, MIN_TOKENS + 3, 9]
    assert mask.sum(1).tolist() == [3, 4, 10]
    assert batch.shared.rows is not None and batch.shared.rows.tolist() == [True, True, False]
    batch.keep([0, 2])
    assert batch.shared is not None and batch.offsets == [MIN_TOKENS, 0]
    batch.keep([1])
    assert batch.shared is None and batch.offsets == [0] and batch.slots == 9


def test_a_short_hit_or_a_full_budget_shares_nothing() -> None:
    system = prompt(MIN_TOKENS, seed=703)
    short = KVBatch()
    _add(short, [*system, 1], hit=MIN_TOKENS - 16)  # below MIN_TOKENS: not worth a second product
    _add(short, [*system, 2], hit=MIN_TOKENS)  # the batch had none: this one's becomes it
    assert short.offsets == [0, MIN_TOKENS]
    budget = 2 * (MIN_TOKENS + 8)  # two whole rows fit; a shared prefix beside them would not
    tight = KVBatch(budget=budget)
    _add(tight, prompt(MIN_TOKENS + 6, seed=704))
    _add(tight, [*system, 1], hit=MIN_TOKENS)
    assert tight.shared is None and tight.offsets == [0, 0] and tight.allocated <= budget


def _shared_engine(model: PreTrainedModel, speculative: bool) -> Engine:
    spec = SpeculativeConfig(method="ngram", tokens=3, ngram_max=3, ngram_min=1) if speculative else None
    limits = GenerationConfig(
        max_running=6,
        prefill_chunk_tokens=96,
        prefill_pack_tokens=512,
        kv_cache_tokens=2048,
        speculative=spec,
    )
    proposer = NgramProposer(3, 3, 1) if speculative else None
    return Engine(model, (), limits, proposer=proposer)


@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_rows_sharing_a_system_prompt_get_the_reference_tokens(
    arch: str, speculative: bool, request: pytest.FixtureRequest
) -> None:
    """A first request computes the system prompt; four more with it (one whose turn repeats itself, for
    prompt lookup) and two without join while it runs: the batch holds the prompt once while they share it,
    within its budget, and every one gets the reference tokens."""
    model: PreTrainedModel = request.getfixturevalue(arch)
    engine = _shared_engine(grouped_copy(model), speculative)
    events = Events()
    first = Req("first", SYSTEM + prompt(4, seed=710), 24)
    sharing = [Req(f"s{i}", SYSTEM + prompt(3 + 2 * i, seed=720 + i), 8 + 3 * i) for i in range(3)]
    sharing.append(Req("rep", SYSTEM + prompt(4, seed=730) * 4, 12))
    others = [Req("o0", prompt(30, seed=740), 9), Req("o1", prompt(5, seed=741), 6)]
    plan = {0: [first], 2: sharing[:2] + others[:1], 5: sharing[2:] + others[1:]}
    held: list[int] = []  # rows sharing the prefix, per step
    for i in range(200):
        submit(engine, events, plan.get(i, []))
        busy = step(engine)  # budget invariants after every step
        batch = engine._batch
        held.append(sum(1 for o in batch.offsets if o) if batch.shared is not None else 0)
        if not busy and i > max(plan):
            break
    assert_greedy_parity(model, events, [first, *sharing, *others])
    assert max(held) >= 4  # the later ones with the system prompt shared it at once
    assert engine._batch.shared is None  # dropped with its last row
    if speculative:
        spec = engine.stats().spec
        assert spec is not None and spec.checks > 0
