"""The running batch's KV cache: one transformers ``DynamicCache``, its rows left-padded to one length.

Each sequence is prefilled alone (so its prompt's numbers are those of ``model.generate`` for it alone),
then its cache joins the batch as a new row: the shorter side is padded on the left with masked columns.
A finished row leaves by index; columns that are padding in every remaining row are cut. Row ``i``'s
real tokens are the last ``lengths[i]`` columns, so the cache holds ``rows x columns`` token slots.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class UnsupportedCacheError(RuntimeError):
    """The model's cache has layers this batch cannot merge (sliding windows, linear attention)."""


def check_cache(cache: DynamicCache) -> None:
    kinds = {type(layer).__name__ for layer in cache.layers}
    if kinds != {DynamicLayer.__name__}:
        raise UnsupportedCacheError(f"continuous batching needs full-attention cache layers, got {kinds}")


class KVBatch:
    """Rows of the running batch: their cache, attention mask and real lengths (no torch grad)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cache: DynamicCache | None = None
        self.mask = self._mask(0, 0)
        self.lengths: list[int] = []

    def _mask(self, rows: int, columns: int) -> torch.Tensor:
        return torch.zeros((rows, columns), dtype=torch.long, device=self.device)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    @property
    def slots(self) -> int:
        """Token slots held per layer (padding included): what the KV budget counts."""
        return self.rows * self.columns

    def add(self, cache: DynamicCache, length: int) -> None:
        """Append one prefilled sequence (a one-row cache of ``length`` tokens) as the last row."""
        check_cache(cache)
        if self.cache is None or self.rows == 0:
            self.cache = cache
            self.mask = self._mask(1, length) + 1
            self.lengths = [length]
            return
        width = max(self.columns, length)
        grow, pad = width - self.columns, width - length
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, grow), _pad_left(theirs.keys, pad)], dim=0)
            mine.values = torch.cat([_pad_left(mine.values, grow), _pad_left(theirs.values, pad)], dim=0)
        row = self._mask(1, width)
        row[:, pad:] = 1
        mask = torch.nn.functional.pad(self.mask, (grow, 0)) if grow else self.mask
        self.mask = torch.cat([mask, row], dim=0)
        self.lengths.append(length)

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention mask and position ids of one decode step (one new token per row)."""
        mask = torch.nn.functional.pad(self.mask, (0, 1), value=1)
        positions = torch.tensor(self.lengths, dtype=torch.long, device=self.device)[:, None]
        return mask, positions

    def advance(self, mask: torch.Tensor) -> None:
        """After a decode step: every row holds one token more (the model appended to the cache)."""
        self.mask = mask
        self.lengths = [n + 1 for n in self.lengths]

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order), then cut the columns no remaining row uses."""
        if len(rows) == self.rows:
            return
        self.lengths = [self.lengths[i] for i in rows]
        if not rows or self.cache is None:
            self.cache, self.mask, self.lengths = None, self._mask(0, 0), []
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        cut = self.columns - max(self.lengths)
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, cut:].contiguous()
            layer.values = layer.values[index, :, cut:].contiguous()
        self.mask = self.mask[index, cut:]


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """(rows, heads, tokens, dim) padded with ``n`` zero columns before the tokens."""
    return torch.nn.functional.pad(t, (0, 0, n, 0)) if n else t
