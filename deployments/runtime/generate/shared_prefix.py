"""A prompt prefix that rows of the running batch share, held once: each step reads it once for all of them.

Chat and RAG traffic sends one long system prompt before every user turn. Stored in every row, a decode
step reads that prompt's keys and values once per row: at 8 rows behind an 800-token system prompt, most of
what a GPT-2-small step reads. Here the batch keeps one copy (``SharedPrefix``) and a row that starts with
it stores only the tokens after it (``KVBatch``). A step's attention (``cascade_attention``) scores every
row's queries against the prefix in one matrix product, which reads it once, and against the row's own
columns, and takes one softmax over both; a row that does not share it gets no weight on it. Each row gets
the numbers of attention over its whole sequence, up to summation order (the batch's rounding).

The batch holds one shared prefix at a time: set by a row that joins after a prefix-cache hit of at least
``MIN_TOKENS`` (the prefix is popular), kept while a row uses it, dropped with the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_TOKENS = 64  # a shorter prefix saves less than the second matrix product costs


@dataclass(slots=True)
class SharedPrefix:
    tokens: list[int]
    keys: list[torch.Tensor]  # per layer: (kv heads, tokens, dim)
    values: list[torch.Tensor]
    rows: torch.Tensor | None = None  # (rows,) bool: which rows of this step share it

    @property
    def length(self) -> int:
        return len(self.tokens)

    def starts(self, prompt: list[int]) -> bool:
        """Whether ``prompt`` begins with the prefix and goes on after it (a row stores at least a token)."""
        return len(prompt) > self.length and prompt[: self.length] == self.tokens


def cascade_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    shared: SharedPrefix,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of ``query`` (rows, heads, tokens, dim) over the shared prefix (where ``shared.rows``) and
    each row's own ``key``/``value`` columns, ``attention_mask`` (boolean: True attends, or additive;
    broadcast to (rows, 1, tokens, columns)) masking the latter. Returns (rows, tokens, heads, dim), the
    layout transformers' attention functions return."""
    layer = int(getattr(module, "layer_idx", 0))
    prefix_k, prefix_v = shared.keys[layer], shared.values[layer]
    rows, heads, tokens, dim = query.shape
    groups = heads // key.shape[1]
    if groups > 1:  # grouped-query attention: each kv head serves `groups` query heads
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        prefix_k, prefix_v = prefix_k.repeat_interleave(groups, 0), prefix_v.repeat_interleave(groups, 0)
    scale = scaling if scaling is not None else dim**-0.5
    own = torch.matmul(query, key.transpose(-1, -2)) * scale  # (rows, heads, tokens, columns)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            own = own.masked_fill(~attention_mask, float("-inf"))
        else:
            own = own + attention_mask
    # Every row's queries against the prefix in one product per head: the prefix is read once.
    by_head = query.permute(1, 0, 2, 3).reshape(heads, rows * tokens, dim)
    pre = torch.matmul(by_head, prefix_k.transpose(-1, -2)) * scale  # (heads, rows * tokens, prefix)
    pre = pre.reshape(heads, rows, tokens, -1).permute(1, 0, 2, 3)
    if shared.rows is not None:
        pre = pre.masked_fill(~shared.rows[:, None, None, None], float("-inf"))
    weights = torch.cat([pre, own], dim=-1).softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    length = prefix_k.shape[1]
    from_prefix = torch.matmul(
        weights[..., :length].permute(1, 0, 2, 3).reshape(heads, rows * tokens, length), prefix_v
    ).reshape(heads, rows, tokens, dim)
    out = from_prefix.permute(1, 0, 2, 3) + torch.matmul(weights[..., length:], value)
    return out.transpose(1, 2).contiguous()
