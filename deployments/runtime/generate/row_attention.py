"""Decode-step attention by groups of rows of similar length: short rows stop reading the longest's padding.

The running batch pads every row to its longest (``KVBatch``): one SDPA call over ``rows x longest``
columns. With mixed lengths much of what it reads is padding (masked, but still read and scored), and at
32 rows attention costs about as much as every linear layer together. Here a decode step's rows are cut
into contiguous groups (the cheapest cut, ``plan_groups``), and each group attends over its own longest
row only: its own SDPA call, the same kernel and mask, narrower. A masked column adds exactly zero, so each
row gets the numbers it had over the full width, up to the kernel's summation order (the batch's rounding).

A packed prefill (``prompt_bounds``: prompts end to end) gets one causal SDPA call per prompt, over its
own tokens; any other call without a plan takes transformers' SDPA path unchanged.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from deployments.runtime.generate.shared_prefix import SharedPrefix, cascade_attention

IMPLEMENTATION = "textserve_row_groups"
# What one more SDPA call costs, in row x column units (a column of one row, every head): a call's own fixed
# cost is about what a hundred-odd columns cost to read and score (GPT-2-small on a CPU).
CALL_COST = 128


@dataclass(frozen=True, slots=True)
class RowGroup:
    start: int  # first row
    stop: int  # one past the last row
    width: int  # columns this group attends over: its longest row's, with this step's new token
    full: bool  # every row is that long: no mask needed


def plan_groups(lengths: list[int], call_cost: int | None = None) -> tuple[RowGroup, ...]:
    """The cut of rows (in their batch order) into contiguous groups that reads the fewest columns, counting
    ``call_cost`` (default ``CALL_COST``) per group. ``lengths``: each row's attended columns this step (cache
    plus the new token)."""
    call_cost = CALL_COST if call_cost is None else call_cost
    n = len(lengths)
    best = [0] + [0] * n  # best[j]: cheapest cost of rows [0, j)
    cut = [0] * (n + 1)  # where the last group of rows [0, j) starts
    for j in range(1, n + 1):
        widest, best[j] = 0, -1
        for i in range(j, 0, -1):  # the last group is rows [i - 1, j)
            widest = max(widest, lengths[i - 1])
            cost = best[i - 1] + widest * (j - i + 1) + call_cost
            if best[j] < 0 or cost <= best[j]:  # on a tie, the larger group: fewer calls
                best[j], cut[j] = cost, i - 1
    groups: list[RowGroup] = []
    j = n
    while j > 0:
        i = cut[j]
        part = lengths[i:j]
        width = max(part)
        groups.append(RowGroup(i, j, width, min(part) == width))
        j = i
    return tuple(reversed(groups))


def row_group_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    row_groups: tuple[RowGroup, ...] | None = None,
    prompt_bounds: tuple[int, ...] | None = None,
    shared_prefix: SharedPrefix | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: over a shared prefix and each row's own columns for a batch that
    holds one, grouped for a decode step with a plan, by prompt for a packed prefill, plain SDPA otherwise."""
    if shared_prefix is not None:
        return cascade_attention(module, query, key, value, attention_mask, shared_prefix, scaling), None
    if prompt_bounds is not None:
        return _packed_prefill(module, query, key, value, prompt_bounds, scaling, **kwargs), None
    if row_groups is None or query.shape[2] != 1 or len(row_groups) == 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    parts = []
    for g in row_groups:
        mask = None
        if attention_mask is not None and not g.full:
            mask = attention_mask[g.start : g.stop, ..., : g.width]
        out, _ = sdpa_attention_forward(
            module,
            query[g.start : g.stop],
            key[g.start : g.stop, :, : g.width],
            value[g.start : g.stop, :, : g.width],
            mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=False,  # one query token: it sees every column of its row
            **kwargs,
        )
        parts.append(out)
    return torch.cat(parts), None


def _packed_prefill(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bounds: tuple[int, ...],
    scaling: float | None,
    **kwargs: object,
) -> torch.Tensor:
    """Prompts laid end to end in one sequence (``bounds``: where each starts, then the end): each attends
    causally over its own tokens only, one SDPA call each, as it would alone."""
    kwargs.pop("is_causal", None)
    parts = []
    for start, stop in itertools.pairwise(bounds):
        out, _ = sdpa_attention_forward(
            module,
            query[:, :, start:stop],
            key[:, :, start:stop],
            value[:, :, start:stop],
            None,
            scaling=scaling,
            is_causal=True,
            **kwargs,
        )
        parts.append(out)  # (batch, tokens, heads, dim): transformers' layout after attention
    return torch.cat(parts, dim=1)


AttentionInterface.register(IMPLEMENTATION, row_group_attention)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def use_row_groups(model: PreTrainedModel) -> bool:
    """Switch ``model`` (loaded with SDPA) to grouped decode attention; False where it does not apply."""
    if model.config._attn_implementation != "sdpa":
        return False
    model.set_attn_implementation(IMPLEMENTATION)  # a model that cannot switch warns and keeps SDPA
    return bool(model.config._attn_implementation == IMPLEMENTATION)
