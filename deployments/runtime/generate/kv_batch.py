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


# Columns a layer's buffer keeps free past its tokens: decode steps write into them in place, where a plain
# DynamicLayer concatenates (copies the whole batch's cache) at every step.
HEADROOM = 64


class SlotLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values live in a buffer with room to grow: an update
    writes the new columns in place and returns views of the filled part."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.is_initialized = True
        self.device = keys.device
        self._filled = 0
        self._k = keys.new_empty(0)
        self._v = values.new_empty(0)
        self._store(keys, values)

    def _store(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        rows, heads, tokens, dim = keys.shape
        self._k = keys.new_empty((rows, heads, tokens + HEADROOM, dim))
        self._v = values.new_empty((rows, heads, tokens + HEADROOM, values.shape[-1]))
        self._k[:, :, :tokens] = keys
        self._v[:, :, :tokens] = values
        self._view(tokens)

    def _view(self, filled: int) -> None:
        self._filled = filled
        self.keys = self._k[:, :, :filled]
        self.values = self._v[:, :, :filled]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._filled + key_states.shape[-2]
        if end > self._k.shape[-2]:
            self._store(self.keys, self.values)  # full: a new buffer, HEADROOM columns larger
        self._k[:, :, self._filled : end] = key_states
        self._v[:, :, self._filled : end] = value_states
        self._view(end)
        return self.keys, self.values


def check_cache(cache: DynamicCache) -> None:
    kinds = {type(layer).__name__ for layer in cache.layers}
    if not kinds <= {DynamicLayer.__name__, SlotLayer.__name__}:
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
            cache.layers[:] = [SlotLayer(layer.keys, layer.values) for layer in cache.layers]
            self.mask = self._mask(1, length) + 1
            self.lengths = [length]
            return
        width = max(self.columns, length)
        grow, pad = width - self.columns, width - length
        layers = zip(self.cache.layers, cache.layers, strict=True)
        self.cache.layers[:] = [
            SlotLayer(
                torch.cat([_pad_left(mine.keys, grow), _pad_left(theirs.keys, pad)], dim=0),
                torch.cat([_pad_left(mine.values, grow), _pad_left(theirs.values, pad)], dim=0),
            )
            for mine, theirs in layers
        ]
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
        self.cache.layers[:] = [
            SlotLayer(layer.keys[index, :, cut:], layer.values[index, :, cut:]) for layer in self.cache.layers
        ]
        self.mask = self.mask[index, cut:]


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """(rows, heads, tokens, dim) padded with ``n`` zero columns before the tokens."""
    return torch.nn.functional.pad(t, (0, 0, n, 0)) if n else t
