"""The running batch's KV cache: rows of different lengths, right-padded, decoded in place, moved, grown."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, MistralConfig
from transformers.cache_utils import DynamicLayer

from deployments.runtime.generate.kv_batch import (
    COLUMN_STEP,
    ROW_STEP,
    KVBatch,
    UnsupportedCacheError,
    check_cache,
)

LAYERS, HEADS, DIM = 2, 2, 4


def _row_cache(row: int, length: int) -> DynamicCache:
    """A one-row cache whose key at position p of layer l is ``100*row + p + 1`` (values: its negative)."""
    cache = DynamicCache()
    for layer in range(LAYERS):
        pos = torch.arange(length, dtype=torch.float32) + 100 * row + 1 + 1000 * layer
        keys = pos[None, None, :, None].expand(1, HEADS, length, DIM).clone()
        cache.update(keys, -keys, layer)
    return cache


def _positions(batch: KVBatch, layer: int = 0) -> torch.Tensor:
    """(rows, columns) of the tagged key numbers, less the layer offset: 0 where a column is padding."""
    assert batch.cache is not None
    keys = batch.cache.layers[layer].keys
    values = batch.cache.layers[layer].values
    assert keys.shape == (batch.rows, HEADS, batch.columns, DIM)
    assert torch.equal(values, -keys)
    assert torch.equal(keys, keys[:, :1, :, :1].expand_as(keys))  # one number per (row, column)
    tags = keys[:, 0, :, 0]
    return torch.where(tags == 0, tags, tags - 1000 * layer)


def _batch(lengths: list[int]) -> KVBatch:
    batch = KVBatch()
    for row, length in enumerate(lengths):
        batch.add(_row_cache(row, length), length)
    return batch


def _tagged(row: int, length: int, width: int) -> list[float]:
    return [100.0 * row + p + 1 for p in range(length)] + [0.0] * (width - length)


def _decode_step(batch: KVBatch, tag: float) -> torch.Tensor:
    """What the model does in a decode step: one new column per row and layer, then ``advance``."""
    mask, _ = batch.step_inputs()
    assert batch.cache is not None
    for layer in range(LAYERS):
        new = torch.full((batch.rows, HEADS, 1, DIM), tag + 1000 * layer)
        keys, values = batch.cache.update(new, -new, layer)
        assert keys.shape == (batch.rows, HEADS, batch.columns + 1, DIM)
        assert torch.equal(values, -keys)
    batch.advance()
    return mask


def test_empty_batch() -> None:
    batch = KVBatch()
    assert (batch.rows, batch.columns, batch.slots, batch.cache, batch.capacity) == (0, 0, 0, None, (0, 0))


def test_add_pads_right() -> None:
    batch = _batch([3, 5, 2])
    assert batch.lengths == [3, 5, 2]
    assert (batch.rows, batch.columns, batch.slots) == (3, 5, 15)
    for layer in range(LAYERS):
        expected = [_tagged(0, 3, 5), _tagged(1, 5, 5), _tagged(2, 2, 5)]
        assert _positions(batch, layer).tolist() == expected


def test_step_inputs_and_a_decode_step() -> None:
    batch = _batch([3, 5])
    mask, positions = batch.step_inputs()
    assert mask.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]  # own columns, new one
    assert mask.dtype == torch.long
    assert positions.tolist() == [[3], [5]]  # each row's next position
    assert batch.columns == 5  # step_inputs alone changes nothing
    _decode_step(batch, 7.0)
    assert batch.lengths == [4, 6]
    assert (batch.columns, batch.slots) == (6, 12)
    assert batch.cache is not None and batch.cache.get_seq_length() == 6
    # Each row's new token went to that row's own next column, not to a shared last one.
    assert _positions(batch).tolist() == [[1, 2, 3, 7, 0, 0], [101, 102, 103, 104, 105, 7]]
    assert _positions(batch, 1).tolist() == [[1, 2, 3, 7, 0, 0], [101, 102, 103, 104, 105, 7]]


def test_an_update_of_other_than_the_asked_tokens_is_refused() -> None:
    batch = _batch([2])
    batch.step_inputs()
    assert batch.cache is not None
    with pytest.raises(RuntimeError, match="the tokens step_inputs was asked for"):
        batch.cache.update(torch.zeros(1, HEADS, 2, DIM), torch.zeros(1, HEADS, 2, DIM), 0)


def test_keep_moves_the_last_rows_into_the_holes() -> None:
    batch = _batch([3, 6, 2, 4])
    order = batch.keep([0, 2, 3])  # row 1 leaves: row 3 moves into its place, the others stay
    assert order == [0, 3, 2]
    assert batch.lengths == [3, 4, 2]
    assert (batch.rows, batch.columns, batch.slots) == (3, 4, 12)  # the longest row gone: 4 columns
    for layer in range(LAYERS):
        expected = [_tagged(0, 3, 4), _tagged(3, 4, 4), _tagged(2, 2, 4)]
        assert _positions(batch, layer).tolist() == expected
    assert batch.keep([1]) == [1]
    assert (batch.lengths, batch.columns, batch.slots) == ([4], 4, 4)
    assert _positions(batch).tolist() == [_tagged(3, 4, 4)]


def test_keep_every_row_and_the_last_rows() -> None:
    batch = _batch([5, 2, 5])
    assert batch.keep([0, 1, 2]) == [0, 1, 2]  # every row: nothing changes
    assert (batch.rows, batch.columns) == (3, 5)
    assert batch.keep([0, 1]) == [0, 1]  # the last row leaves: nothing moves
    assert (batch.rows, batch.columns, batch.slots) == (2, 5, 10)
    assert _positions(batch).tolist() == [_tagged(0, 5, 5), _tagged(1, 2, 5)]


def test_a_moved_row_decodes_at_its_own_column() -> None:
    batch = _batch([2, 5, 3])
    assert batch.keep([0, 2]) == [0, 2]
    _decode_step(batch, 9.0)
    assert batch.lengths == [3, 4]
    assert _positions(batch).tolist() == [[1, 2, 9, 0], [201, 202, 203, 9]]


def test_keep_nothing_keeps_the_buffers_and_the_batch_takes_new_rows() -> None:
    batch = _batch([3, 4])
    capacity = batch.capacity
    assert batch.keep([]) == []
    assert (batch.rows, batch.columns, batch.slots, batch.cache) == (0, 0, 0, None)
    assert batch.capacity == capacity  # kept for the next request: no allocation and zeroing per request
    batch.add(_row_cache(5, 2), 2)
    batch.add(_row_cache(6, 3), 3)
    rows = _positions(batch).tolist()
    # Each row's own columns (past a row's end: what an earlier row left there, masked, finite).
    assert [rows[0][:2], rows[1]] == [_tagged(5, 2, 2), _tagged(6, 3, 3)]


def test_buffers_grow_and_keep_every_row() -> None:
    lengths = [COLUMN_STEP - 1, 2, 3, 1, 4, COLUMN_STEP + 5, 6]  # more rows than ROW_STEP, a row past a step
    batch = _batch(lengths)
    rows, columns = batch.capacity
    assert rows >= len(lengths) > ROW_STEP and columns >= COLUMN_STEP + 5
    width = max(lengths)
    assert _positions(batch).tolist() == [_tagged(row, n, width) for row, n in enumerate(lengths)]
    for step in range(columns - width + 1):  # decode past the columns held: the buffers grow once more
        _decode_step(batch, 0.5 + step)
    assert batch.capacity[1] > columns
    assert batch.lengths == [n + columns - width + 1 for n in lengths]
    keys = batch.cache.layers[0].keys if batch.cache is not None else None
    assert keys is not None and keys[0, 0, : lengths[0], 0].tolist() == _tagged(0, lengths[0], lengths[0])


def test_slots_are_rows_times_columns() -> None:
    batch = KVBatch()
    for row, length in enumerate([4, 1, 9, 3]):
        batch.add(_row_cache(row, length), length)
        assert batch.slots == batch.rows * batch.columns == (row + 1) * max(batch.lengths)


def test_masked_columns_hold_finite_numbers() -> None:
    """A masked score is computed before the mask replaces it: the padding must not be NaN or inf."""
    batch = _batch([1, 30])
    batch.keep([0])
    batch.add(_row_cache(2, 3), 3)
    _decode_step(batch, 1.0)
    for layer in batch._keys + batch._values:
        assert torch.isfinite(layer).all()


def test_check_cache_accepts_full_attention_layers() -> None:
    cache = _row_cache(0, 2)
    assert {type(layer) for layer in cache.layers} == {DynamicLayer}
    check_cache(cache)


def test_check_cache_refuses_a_sliding_window_cache() -> None:
    config = MistralConfig(
        num_hidden_layers=2,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=50,
        sliding_window=4,
    )
    cache = DynamicCache(config=config)
    with pytest.raises(UnsupportedCacheError, match="full-attention"):
        check_cache(cache)
    with pytest.raises(UnsupportedCacheError):
        _batch([2]).add(cache, 2)


class _FakeLayer:
    keys = torch.zeros(1, HEADS, 2, DIM)
    values = torch.zeros(1, HEADS, 2, DIM)


def test_check_cache_refuses_other_layer_kinds() -> None:
    cache = _row_cache(0, 2)
    cache.layers[1] = _FakeLayer()  # type: ignore[call-overload]
    with pytest.raises(UnsupportedCacheError, match="_FakeLayer"):
        check_cache(cache)
    batch = KVBatch()
    with pytest.raises(UnsupportedCacheError):
        batch.add(cache, 2)  # refused before it becomes the batch's cache
    assert (batch.rows, batch.cache) == (0, None)
