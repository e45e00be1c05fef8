"""The running batch's KV cache: rows of different lengths padded on the left, masked, dropped, trimmed."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, MistralConfig
from transformers.cache_utils import DynamicLayer

from deployments.runtime.generate.kv_batch import KVBatch, UnsupportedCacheError, check_cache

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
    return [0.0] * (width - length) + [100.0 * row + p + 1 for p in range(length)]


def test_empty_batch() -> None:
    batch = KVBatch()
    assert (batch.rows, batch.columns, batch.slots, batch.cache) == (0, 0, 0, None)


def test_add_pads_left_and_masks() -> None:
    batch = _batch([3, 5, 2])
    assert batch.lengths == [3, 5, 2]
    assert (batch.rows, batch.columns, batch.slots) == (3, 5, 15)
    assert batch.mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    for layer in range(LAYERS):
        expected = [_tagged(0, 3, 5), _tagged(1, 5, 5), _tagged(2, 2, 5)]
        assert _positions(batch, layer).tolist() == expected
    # The first row added grew on the left when the longer second row came.
    assert batch.mask.dtype == torch.long


def test_step_inputs_and_advance() -> None:
    batch = _batch([3, 5])
    mask, positions = batch.step_inputs()
    assert mask.tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    assert positions.tolist() == [[3], [5]]  # each row's real next position, not the padded column
    assert batch.columns == 5  # step_inputs alone changes nothing
    # What the model does in a decode step: one column more in every layer.
    assert batch.cache is not None
    for layer in range(LAYERS):
        new = torch.full((2, HEADS, 1, DIM), 7.0)
        batch.cache.update(new, -new, layer)
    batch.advance(mask)
    assert batch.lengths == [4, 6]
    assert (batch.columns, batch.slots) == (6, 12)
    assert batch.cache.layers[0].keys.shape[2] == batch.columns


def test_keep_drops_rows_and_trims_leading_padding() -> None:
    batch = _batch([3, 6, 2, 4])
    batch.keep([0, 2, 3])  # the longest row leaves: two columns are padding in every row left
    assert batch.lengths == [3, 2, 4]
    assert (batch.rows, batch.columns, batch.slots) == (3, 4, 12)
    assert batch.mask.tolist() == [[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]]
    for layer in range(LAYERS):
        expected = [_tagged(0, 3, 4), _tagged(2, 2, 4), _tagged(3, 4, 4)]
        assert _positions(batch, layer).tolist() == expected
    batch.keep([2, 0])  # keep follows the order given
    assert batch.lengths == [4, 3]
    assert batch.mask.tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert _positions(batch).tolist() == [_tagged(3, 4, 4), _tagged(0, 3, 4)]
    batch.keep([1])
    assert (batch.lengths, batch.columns, batch.slots) == ([3], 3, 3)
    assert batch.mask.tolist() == [[1, 1, 1]]
    assert _positions(batch).tolist() == [_tagged(0, 3, 3)]


def test_keep_without_trim_and_keep_all() -> None:
    batch = _batch([5, 2, 5])
    batch.keep([0, 1, 2])  # every row: nothing changes
    assert (batch.rows, batch.columns) == (3, 5)
    batch.keep([0, 1])  # the longest length is still 5: no column is cut
    assert (batch.rows, batch.columns, batch.slots) == (2, 5, 10)
    assert _positions(batch).tolist() == [_tagged(0, 5, 5), _tagged(1, 2, 5)]


def test_keep_nothing_empties_and_the_batch_takes_new_rows() -> None:
    batch = _batch([3, 4])
    batch.keep([])
    assert (batch.rows, batch.columns, batch.slots, batch.cache) == (0, 0, 0, None)
    batch.add(_row_cache(5, 2), 2)
    batch.add(_row_cache(6, 3), 3)
    assert batch.mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert _positions(batch).tolist() == [_tagged(5, 2, 3), _tagged(6, 3, 3)]


def test_slots_are_rows_times_columns() -> None:
    batch = KVBatch()
    for row, length in enumerate([4, 1, 9, 3]):
        batch.add(_row_cache(row, length), length)
        assert batch.slots == batch.rows * batch.columns == (row + 1) * max(batch.lengths)


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
