"""The running batch's KV cache: one buffer per layer, a row per sequence, its tokens from column 0.

Each sequence is prefilled alone (so its prompt's numbers are those of ``model.generate`` for it alone),
then its one-row cache is copied into the batch's next free row. A decode step writes each row's new key
and value at that row's own column (its length) and attends over the first ``width + 1`` columns, the
columns past a shorter row's end masked (right padding). A finished row leaves by moving the last rows
into the holes. Joining and leaving copy one row each, never the batch: the left-padded batch this
replaced copied the whole cache on every join and leave, a third of the engine's time at 32 requests.

The buffers grow (one copy) only when a row needs more columns, or the batch more rows, than they hold;
they are freed when the batch empties.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class UnsupportedCacheError(RuntimeError):
    """The model's cache has layers this batch cannot merge (sliding windows, linear attention)."""


COLUMN_STEP = 64  # columns are allocated in multiples of this
ROW_STEP = 4  # rows too


def check_cache(cache: DynamicCache) -> None:
    kinds = {type(layer).__name__ for layer in cache.layers}
    if not kinds <= {DynamicLayer.__name__, RowLayer.__name__}:
        raise UnsupportedCacheError(f"continuous batching needs full-attention cache layers, got {kinds}")


class RowLayer(DynamicLayer):
    """One layer of the batch, as the model sees it: ``keys``/``values`` are views of the filled part of
    the batch's buffers, and a decode step's update writes each row's new column where its batch says."""

    def __init__(self, batch: KVBatch, index: int) -> None:
        super().__init__()
        self.is_initialized = True
        self.device = batch.device
        self._batch = batch
        self._index = index

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[-2] != 1:
            raise RuntimeError("the running batch takes one new token per row (decode steps only)")
        return self._batch.write(self._index, key_states, value_states)


class KVBatch:
    """Rows of the running batch: their cache and real lengths (no torch grad)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.cache: DynamicCache | None = None
        self.lengths: list[int] = []
        self._keys: list[torch.Tensor] = []  # per layer: (row capacity, heads, column capacity, dim)
        self._values: list[torch.Tensor] = []
        self._write_rows = torch.zeros(0, dtype=torch.long)
        self._write_columns = torch.zeros(0, dtype=torch.long)
        self._write_width = 0

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        """Columns the model attends over (before a step's new one): the longest row's length."""
        return max(self.lengths, default=0)

    @property
    def slots(self) -> int:
        """Token slots held per layer (padding included): what the KV budget counts."""
        return self.rows * self.columns

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, columns) the buffers hold now."""
        return (int(self._keys[0].shape[0]), int(self._keys[0].shape[2])) if self._keys else (0, 0)

    def add(self, cache: DynamicCache, length: int, start: int = 0) -> None:
        """Append one prefilled sequence as the last row: ``length`` tokens of a one-row cache, from column
        ``start`` (a packed prefill holds several prompts end to end)."""
        check_cache(cache)
        layers = cache.layers
        if not self._keys:
            self._keys = [_zeros(layer.keys, ROW_STEP, length) for layer in layers]
            self._values = [_zeros(layer.values, ROW_STEP, length) for layer in layers]
        self._reserve(self.rows + 1, length)
        row = self.rows
        for mine_k, mine_v, theirs in zip(self._keys, self._values, layers, strict=True):
            mine_k[row, :, :length] = theirs.keys[0, :, start : start + length]
            mine_v[row, :, :length] = theirs.values[0, :, start : start + length]
        self.lengths.append(length)
        if self.cache is None:
            self.cache = DynamicCache()
            self.cache.layers[:] = [RowLayer(self, i) for i in range(len(layers))]
        self._views(self.columns)

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention mask and position ids of one decode step (one new token per row); the step's
        new columns are where ``write`` puts them."""
        self._reserve(self.rows, self.columns + 1)
        lengths = torch.tensor(self.lengths, dtype=torch.long, device=self.device)
        self._write_rows = torch.arange(self.rows, device=self.device)
        self._write_columns = lengths
        self._write_width = self.columns + 1  # once per step, not once per layer
        mask = (torch.arange(self.columns + 1, device=self.device)[None, :] <= lengths[:, None]).long()
        return mask, lengths[:, None]

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step's update of ``layer``: each row's new key and value at its own column; the keys
        and values to attend over (every row's, ``columns + 1`` wide)."""
        rows, columns = self._write_rows, self._write_columns
        self._keys[layer][rows, :, columns] = keys[:, :, 0]
        self._values[layer][rows, :, columns] = values[:, :, 0]
        rows_n, width = len(rows), self._write_width
        return self._keys[layer][:rows_n, :, :width], self._values[layer][:rows_n, :, :width]

    def advance(self) -> None:
        """After a decode step: every row holds one token more (the model wrote it into the buffers)."""
        self.lengths = [n + 1 for n in self.lengths]
        self._views(self.columns)

    def keep(self, rows: list[int]) -> list[int]:
        """Keep only ``rows``; returns the new order: row ``j`` now holds what row ``order[j]`` held.
        Rows past the kept count move into the holes, so only they are copied."""
        if len(rows) == self.rows:
            return list(range(self.rows))
        if not rows:
            self.cache, self.lengths, self._keys, self._values = None, [], [], []
            return []
        kept = set(rows)
        count = len(rows)
        holes = [i for i in range(count) if i not in kept]
        movers = [i for i in range(count, self.rows) if i in kept]
        order = list(range(count))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        if holes:
            width = max(self.lengths[i] for i in movers)
            to = torch.tensor(holes, dtype=torch.long, device=self.device)
            source = torch.tensor(movers, dtype=torch.long, device=self.device)
            for buffer in (*self._keys, *self._values):
                buffer[to, :, :width] = buffer[source, :, :width]
        self.lengths = [self.lengths[i] for i in order]
        self._views(self.columns)
        return order

    def _reserve(self, rows: int, columns: int) -> None:
        """Grow the buffers (one copy) to hold ``rows`` x ``columns``, with room to spare."""
        have_rows, have_columns = self.capacity
        if rows <= have_rows and columns <= have_columns:
            return
        new_rows = have_rows if rows <= have_rows else _round_up(max(rows, have_rows * 2), ROW_STEP)
        if columns > have_columns:
            have_columns = _round_up(max(columns, have_columns * 5 // 4), COLUMN_STEP)
        filled = self.columns
        for buffers in (self._keys, self._values):
            for i, old in enumerate(buffers):
                grown = old.new_zeros((new_rows, old.shape[1], have_columns, old.shape[3]))
                grown[: self.rows, :, :filled] = old[: self.rows, :, :filled]
                buffers[i] = grown

    def _views(self, width: int) -> None:
        if self.cache is None:
            return
        for layer, keys, values in zip(self.cache.layers, self._keys, self._values, strict=True):
            layer.keys = keys[: self.rows, :, :width]
            layer.values = values[: self.rows, :, :width]


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _zeros(like: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """A zeroed buffer (rows, heads, columns, dim): masked columns must hold finite numbers, since a
    masked score is still computed before the mask replaces it."""
    _, heads, _, dim = like.shape
    return like.new_zeros((rows, heads, _round_up(columns, COLUMN_STEP), dim))
