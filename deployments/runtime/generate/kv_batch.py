"""The running batch's KV cache: one buffer per layer, a row per sequence, its tokens from column 0.

Each sequence is prefilled alone (so its prompt's numbers are those of ``model.generate`` for it alone),
then its one-row cache is copied into the batch's next free row. A decode step writes each row's new key
and value at that row's own column (its length) and attends over the first ``width + 1`` columns, the
columns past a shorter row's end masked (right padding). A finished row leaves by moving the last rows
into the holes. Joining and leaving copy one row each, never the batch: the left-padded batch this
replaced copied the whole cache on every join and leave, a third of the engine's time at 32 requests.

The buffers grow (one copy) only when a row needs more columns, or the batch more rows, than they hold,
with room to spare only while rows x columns stays within ``budget`` (the engine's ``kv_cache_tokens``):
the memory allocated never exceeds the budget that admission checks. They are kept when the batch empties:
a lone request after another would otherwise allocate and zero its row's buffers again (tens of MB for
GPT-2-small, as long as a decode step).

A prompt prefix that several rows begin with (a system prompt) is held once (``shared_prefix.py``): such a
row stores only its columns after it, and ``lengths`` stay the rows' whole lengths (their positions).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from deployments.runtime.generate.shared_prefix import MIN_TOKENS, SharedPrefix


class KVBudgetError(RuntimeError):
    """The batch was asked to hold more token slots than its budget (admission should have waited)."""


class UnsupportedCacheError(RuntimeError):
    """The model's cache has layers this batch cannot merge (sliding windows, linear attention)."""


COLUMN_STEP = 64  # columns are allocated in multiples of this
ROW_STEP = 1  # rows grow by doubling: a lone request holds one row


def check_cache(cache: DynamicCache) -> None:
    kinds = {type(layer).__name__ for layer in cache.layers}
    if not kinds <= {DynamicLayer.__name__, RowLayer.__name__, PromptLayer.__name__}:
        raise UnsupportedCacheError(f"continuous batching needs full-attention cache layers, got {kinds}")


class PromptLayer(DynamicLayer):
    """One layer of a prompt's own cache while it is prefilled: a buffer for the whole prompt, each piece
    (and a cached prefix) written in place. ``DynamicLayer`` copies the whole cache into a new tensor at every
    piece: for a 30-token turn after an 800-token cached prefix, 800 tokens' keys and values copied again."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.length = length
        self.filled = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            batch, heads, _, dim = key_states.shape
            self._k = key_states.new_empty((batch, heads, self.length, dim))
            self._v = value_states.new_empty((batch, heads, self.length, value_states.shape[-1]))
            self.device = key_states.device
            self.is_initialized = True
        end = self.filled + key_states.shape[-2]
        self._k[:, :, self.filled : end] = key_states
        self._v[:, :, self.filled : end] = value_states
        self.filled = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values


def prompt_cache(config: object, length: int) -> DynamicCache:
    """A one-row cache for a prompt of ``length`` tokens, filled in place (``PromptLayer``)."""
    cache = DynamicCache(config=config)
    check_cache(cache)
    cache.layers[:] = [PromptLayer(length) for _ in cache.layers]
    return cache


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
        return self._batch.write(self._index, key_states, value_states)


class KVBatch:
    """Rows of the running batch: their cache and real lengths (no torch grad)."""

    def __init__(self, device: torch.device | str = "cpu", budget: int | None = None) -> None:
        self.device = torch.device(device)
        self.budget = budget  # token slots per layer the buffers may hold (rows x columns); None: no bound
        self.cache: DynamicCache | None = None
        self.lengths: list[int] = []  # each row's tokens, a shared prefix included: its next position
        self.offsets: list[int] = []  # each row's tokens held in the shared prefix (0: none)
        self.shared: SharedPrefix | None = None
        self._keys: list[torch.Tensor] = []  # per layer: (row capacity, heads, column capacity, dim)
        self._values: list[torch.Tensor] = []
        self._write_rows = torch.zeros(0, dtype=torch.long)
        self._write_columns = torch.zeros(0, dtype=torch.long)
        self._write_width = 0
        self._write_tokens = 1

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def longest(self) -> int:
        """The longest row's length, a shared prefix included."""
        return max(self.lengths, default=0)

    @property
    def stored(self) -> list[int]:
        """Each row's columns in the buffers: its length less what the shared prefix holds."""
        return [n - o for n, o in zip(self.lengths, self.offsets, strict=True)]

    @property
    def columns(self) -> int:
        """The buffers' columns in use (before a step's new one): the longest row's stored part."""
        return max(self.stored, default=0)

    @property
    def shared_slots(self) -> int:
        return self.shared.length if self.shared is not None else 0

    @property
    def slots(self) -> int:
        """Token slots held per layer (padding and the shared prefix included): what the budget counts."""
        return self.rows * self.columns + self.shared_slots

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, columns) the buffers hold now."""
        return (int(self._keys[0].shape[0]), int(self._keys[0].shape[2])) if self._keys else (0, 0)

    def add(
        self, cache: DynamicCache, length: int, start: int = 0, prompt: list[int] | None = None, hit: int = 0
    ) -> None:
        """Append one prefilled sequence as the last row: ``length`` tokens of a one-row cache, from column
        ``start`` (a packed prefill holds several prompts end to end). ``prompt``: its tokens, for sharing
        a prefix; ``hit``: how many of them the prefix cache held (a popular prefix)."""
        check_cache(cache)
        layers = cache.layers
        if not self._keys:
            self._keys = [_zeros(layer.keys) for layer in layers]
            self._values = [_zeros(layer.values) for layer in layers]
        offset = self._share(cache, start, prompt, hit, length)
        self._reserve(self.rows + 1, length - offset)
        row, width = self.rows, length - offset
        for mine_k, mine_v, theirs in zip(self._keys, self._values, layers, strict=True):
            mine_k[row, :, :width] = theirs.keys[0, :, start + offset : start + length]
            mine_v[row, :, :width] = theirs.values[0, :, start + offset : start + length]
        self.lengths.append(length)
        self.offsets.append(offset)
        if self.cache is None:
            self.cache = DynamicCache()
            self.cache.layers[:] = [RowLayer(self, i) for i in range(len(layers))]
        self._views(self.columns)

    def _share(self, cache: DynamicCache, start: int, prompt: list[int] | None, hit: int, length: int) -> int:
        """How many of the joining row's first tokens the shared prefix holds: it shares the batch's, or
        its popular prefix becomes the batch's (where the buffers leave room for it), or none. The engine
        passes a ``hit`` only when its reservation leaves room for it."""
        if prompt is None:
            return 0
        if self.shared is None and hit >= MIN_TOKENS and length > hit:
            need = (self.rows + 1) * max(self.columns, length - hit)
            if self.budget is not None and hit + max(self.allocated, need) > self.budget:
                return 0
            self.shared = SharedPrefix(
                prompt[:hit],
                [layer.keys[0, :, start : start + hit].clone() for layer in cache.layers],
                [layer.values[0, :, start : start + hit].clone() for layer in cache.layers],
            )
        return self.shared.length if self.shared is not None and self.shared.starts(prompt) else 0

    @property
    def allocated(self) -> int:
        """Token slots per layer the buffers and the shared prefix hold now: at most ``budget``."""
        rows, columns = self.capacity
        return rows * columns + self.shared_slots

    def step_inputs(self, tokens: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention mask and position ids of one decode step of ``tokens`` new tokens per row (more
        than one: a speculative check); the step's new columns are where ``write`` puts them. One token: a
        padding mask (rows, columns + 1); more: each new token sees its row's cache and the new tokens up to
        itself, a 4D mask (rows, 1, tokens, columns + tokens) that the model takes as it is."""
        self._reserve(self.rows, self.columns + tokens)
        new = torch.arange(tokens, device=self.device)[None, :]
        positions = torch.tensor(self.lengths, dtype=torch.long, device=self.device)[:, None] + new
        stored = torch.tensor(self.stored, dtype=torch.long, device=self.device)
        at = stored[:, None] + new  # where the new tokens go in each row's columns
        self._write_rows = torch.arange(self.rows, device=self.device).repeat_interleave(tokens)
        self._write_columns = at.reshape(-1)
        self._write_tokens = tokens
        self._write_width = self.columns + tokens  # once per step, not once per layer
        if self.shared is not None:
            self.shared.rows = torch.tensor([o > 0 for o in self.offsets], device=self.device)
        columns = torch.arange(self._write_width, device=self.device)
        if tokens == 1:
            return (columns[None, :] <= stored[:, None]).long(), positions
        return columns[None, None, None, :] <= at[:, None, :, None], positions

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step's update of ``layer``: each row's new keys and values from its own column; the keys
        and values to attend over (every row's, ``columns + tokens`` wide)."""
        if keys.shape[-2] != self._write_tokens:
            raise RuntimeError("a decode step writes the tokens step_inputs was asked for")
        rows, columns = self._write_rows, self._write_columns
        self._keys[layer][rows, :, columns] = keys.transpose(1, 2).reshape(len(rows), keys.shape[1], -1)
        self._values[layer][rows, :, columns] = values.transpose(1, 2).reshape(len(rows), values.shape[1], -1)
        rows_n, width = self.rows, self._write_width
        return self._keys[layer][:rows_n, :, :width], self._values[layer][:rows_n, :, :width]

    def advance(self, kept: list[int] | None = None) -> None:
        """After a decode step: every row holds one token more (the model wrote it into the buffers), or
        ``kept[r]`` more (a speculative check keeps the tokens it accepted; the rest of what it wrote lies
        past the row's end, masked, and is overwritten by the next step)."""
        steps = [1] * self.rows if kept is None else kept
        self.lengths = [n + k for n, k in zip(self.lengths, steps, strict=True)]
        self._views(self.columns)

    def keep(self, rows: list[int]) -> list[int]:
        """Keep only ``rows``; returns the new order: row ``j`` now holds what row ``order[j]`` held.
        Rows past the kept count move into the holes, so only they are copied."""
        if len(rows) == self.rows:
            return list(range(self.rows))
        if not rows:  # the buffers stay, within the budget, for the next request
            self.cache, self.lengths, self.offsets, self.shared = None, [], [], None
            return []
        kept = set(rows)
        count = len(rows)
        holes = [i for i in range(count) if i not in kept]
        movers = [i for i in range(count, self.rows) if i in kept]
        order = list(range(count))
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        if holes:
            width = max(self.lengths[i] - self.offsets[i] for i in movers)
            to = torch.tensor(holes, dtype=torch.long, device=self.device)
            source = torch.tensor(movers, dtype=torch.long, device=self.device)
            for buffer in (*self._keys, *self._values):
                buffer[to, :, :width] = buffer[source, :, :width]
        self.lengths = [self.lengths[i] for i in order]
        self.offsets = [self.offsets[i] for i in order]
        if not any(self.offsets):
            self.shared = None  # its last row left
        self._views(self.columns)
        return order

    def _reserve(self, rows: int, columns: int) -> None:
        """Grow the buffers (one copy) to hold ``rows`` x ``columns``, with room to spare in the budget."""
        have_rows, have_columns = self.capacity
        if rows <= have_rows and columns <= have_columns:
            return
        new_rows, new_columns = self._fit(
            max(rows, self.rows),
            max(columns, self.columns),
            have_rows if rows <= have_rows else max(rows, have_rows * 2),
            have_columns if columns <= have_columns else max(columns, have_columns * 5 // 4),
        )
        filled = self.columns
        for buffers in (self._keys, self._values):
            for i, old in enumerate(buffers):
                grown = old.new_zeros((new_rows, old.shape[1], new_columns, old.shape[3]))
                grown[: self.rows, :, :filled] = old[: self.rows, :, :filled]
                buffers[i] = grown

    def _fit(self, rows: int, columns: int, want_rows: int, want_columns: int) -> tuple[int, int]:
        """The roomiest shape of the ones tried, in order, that stays within the budget: the spare room
        goes first, the rounding last. Admission keeps ``rows x columns`` itself within it."""
        shapes = [
            (_round_up(want_rows, ROW_STEP), _round_up(want_columns, COLUMN_STEP)),
            (_round_up(rows, ROW_STEP), _round_up(want_columns, COLUMN_STEP)),
            (_round_up(want_rows, ROW_STEP), _round_up(columns, COLUMN_STEP)),
            (_round_up(rows, ROW_STEP), _round_up(columns, COLUMN_STEP)),
            (rows, _round_up(columns, COLUMN_STEP)),
            (_round_up(rows, ROW_STEP), columns),
        ]
        budget = None if self.budget is None else self.budget - self.shared_slots
        for shape in shapes:
            if budget is None or shape[0] * shape[1] <= budget:
                return shape
        if rows * columns > budget:  # type: ignore[operator]  # budget is set: the loop tried it
            raise KVBudgetError(
                f"{rows} rows x {columns} columns and a {self.shared_slots}-token shared prefix exceed "
                f"the KV budget of {self.budget} slots"
            )
        return rows, columns

    def _views(self, width: int) -> None:
        if self.cache is None:
            return
        for layer, keys, values in zip(self.cache.layers, self._keys, self._values, strict=True):
            layer.keys = keys[: self.rows, :, :width]
            layer.values = values[: self.rows, :, :width]


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _zeros(like: torch.Tensor) -> torch.Tensor:
    """An empty buffer (0 rows, heads, 0 columns, dim) that ``_reserve`` grows. Grown buffers are zeroed:
    masked columns must hold finite numbers, since a masked score is still computed before the mask
    replaces it."""
    _, heads, _, dim = like.shape
    return like.new_zeros((0, heads, 0, dim))
