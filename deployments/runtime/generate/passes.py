"""The model passes the engine runs (``engine.py`` decides when): a piece of one prompt, whole prompts
packed into one pass, a decode step of the running batch, and a speculative check of several tokens per
row. No scheduling here.

Every pass gives each prompt or row the numbers it gets alone: a piece extends its prompt's own one-row
cache; a pack lays prompts end to end and each attends over its own tokens only
(``row_attention``'s prompt bounds); a decode step's padded columns are masked.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from deployments.runtime.generate.kv_batch import KVBatch
from deployments.runtime.generate.row_attention import IMPLEMENTATION, plan_groups


def can_pack(model: PreTrainedModel) -> bool:
    """Packing needs attention that keeps each prompt to itself: the row-group implementation."""
    return bool(model.config._attn_implementation == IMPLEMENTATION)


def prefill_piece(
    model: PreTrainedModel, prompt: list[int], start: int, end: int, cache: DynamicCache
) -> torch.Tensor:
    """Tokens ``start:end`` of ``prompt`` into its ``cache`` (which holds the ones before): the logits
    after the last of them (1, vocab)."""
    dev = model.device
    out = model(
        input_ids=torch.tensor([prompt[start:end]], device=dev),
        attention_mask=torch.ones((1, end), dtype=torch.long, device=dev),
        position_ids=torch.arange(start, end, device=dev)[None],
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1, :]


def prefill_pack(
    model: PreTrainedModel, prompts: list[list[int]]
) -> tuple[torch.Tensor, DynamicCache, list[int]]:
    """Whole ``prompts`` in one pass (a model that ``can_pack``): each one's next-token logits (prompts,
    vocab), the pass's one-row cache with the prompts end to end, and where each starts in it."""
    dev = model.device
    bounds = [0]
    for p in prompts:
        bounds.append(bounds[-1] + len(p))
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=torch.tensor([[t for p in prompts for t in p]], device=dev),
        position_ids=torch.cat([torch.arange(len(p), device=dev) for p in prompts])[None],
        cache=cache,
        use_cache=True,
        logits_to_keep=torch.tensor(bounds[1:], device=dev) - 1,
        prompt_bounds=tuple(bounds),
    )
    return out.logits[0], cache, bounds[:-1]


def decode_step(model: PreTrainedModel, batch: KVBatch, ids: torch.Tensor) -> torch.Tensor:
    """One decode step of ``batch``, ``ids`` its rows' new tokens (rows, 1): the next-token logits (rows,
    vocab). The batch then holds one token more per row. A model switched to grouped decode attention
    (``row_attention.use_row_groups``) gets this step's plan."""
    mask, positions = batch.step_inputs()
    plan: dict[str, object] = {}
    if batch.shared is not None:  # rows that hold a prefix once: cascade attention (shared_prefix.py)
        plan["shared_prefix"] = batch.shared
    elif can_pack(model):
        plan["row_groups"] = plan_groups([n + 1 for n in batch.stored])
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=batch.cache, use_cache=True, **plan
    )
    batch.advance()
    return out.logits[:, -1, :]


def verify_step(model: PreTrainedModel, batch: KVBatch, ids: torch.Tensor) -> torch.Tensor:
    """A speculative check of ``batch``: ``ids`` (rows, tokens) each row's next token and its proposals,
    in one pass, each seeing its row's cache and the tokens before it. The logits after each (rows, tokens,
    vocab). The batch's lengths stay: the caller advances each row by what it accepted."""
    mask, positions = batch.step_inputs(ids.shape[1])
    plan = {"shared_prefix": batch.shared} if batch.shared is not None else {}
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, cache=batch.cache, use_cache=True, **plan
    )
    return out.logits
