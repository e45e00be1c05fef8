"""Decode-step attention by groups of rows (deployments/runtime/generate/row_attention.py): the cheapest cut,
and the same numbers as one SDPA call over the padded batch."""

from __future__ import annotations

import itertools
import random
from copy import deepcopy

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

from deployments.runtime.generate import row_attention
from deployments.runtime.generate.kv_batch import KVBatch
from deployments.runtime.generate.passes import decode_step
from deployments.runtime.generate.row_attention import RowGroup, plan_groups, use_row_groups
from tests.unit.deployments.runtime.generate_support import grouped_copy, prompt


def _cost(groups: tuple[RowGroup, ...], call_cost: int) -> int:
    return sum((g.stop - g.start) * g.width + call_cost for g in groups)


def _brute_force(lengths: list[int], call_cost: int) -> int:
    """The cheapest of every cut of the rows into contiguous groups."""
    n, best = len(lengths), None
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        cost = sum(max(lengths[a:b]) * (b - a) + call_cost for a, b in itertools.pairwise(bounds))
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


def test_the_plan_is_the_cheapest_cut_and_covers_every_row_once() -> None:
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 400) for _ in range(rng.randint(1, 8))]
        call_cost = rng.choice([0, 16, 128, 1000])
        groups = plan_groups(lengths, call_cost)
        assert [g.start for g in groups] == [0] + [g.stop for g in groups[:-1]]
        assert groups[-1].stop == len(lengths)
        for g in groups:
            part = lengths[g.start : g.stop]
            assert g.width == max(part) and g.full == (min(part) == max(part))
        assert _cost(groups, call_cost) == _brute_force(lengths, call_cost)


def test_what_the_call_cost_decides() -> None:
    assert plan_groups([50, 50, 50]) == (RowGroup(0, 3, 50, True),)
    assert plan_groups([400, 400, 10, 10], call_cost=0) == (
        RowGroup(0, 2, 400, True),
        RowGroup(2, 4, 10, True),
    )
    assert plan_groups([400, 10], call_cost=10_000) == (RowGroup(0, 2, 400, False),)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_grouped_decode_step_computes_what_the_padded_one_does(
    arch: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(row_attention, "CALL_COST", 0)  # as many groups as the lengths allow
    model: PreTrainedModel = request.getfixturevalue(arch)
    grouped = grouped_copy(model, packed=False)
    lengths = [30, 7, 7, 60, 12, 31]
    logits: dict[bool, list[torch.Tensor]] = {False: [], True: []}
    for m, by_groups in ((model, False), (grouped, True)):
        batch = KVBatch()
        with torch.inference_mode():
            for i, n in enumerate(lengths):
                cache = DynamicCache(config=m.config)
                ids = torch.tensor([prompt(n, seed=i)])
                m(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, use_cache=True)
                batch.add(cache, n)
            for step in range(3):
                assert len(plan_groups([n + 1 for n in batch.lengths])) > 1  # what the grouped model gets
                ids = torch.tensor([[prompt(1, seed=100 + step + r)[0]] for r in range(len(lengths))])
                logits[by_groups].append(decode_step(m, batch, ids))
    for want, got in zip(logits[False], logits[True], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_model_off_sdpa_is_left_as_it_is(gpt2: PreTrainedModel) -> None:
    eager = deepcopy(gpt2)
    eager.set_attn_implementation("eager")
    assert not use_row_groups(eager)
    assert eager.config._attn_implementation == "eager"
