"""Compact embeddings: int8, uint8, binary and ubinary, with sentence-transformers' semantics.

The same arithmetic as ``sentence_transformers.quantization.quantize_embeddings`` (tests check it),
written out so that the serving path does not import sentence-transformers. The int8 ranges are the
model's own, calibrated once and recorded in its manifest (``deployments.tools.calibrate``): each
request is then quantized the same way, however few texts it holds.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from contracts.errors import InvalidRequestError

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = get_args(EmbeddingType)


def quantize(values: np.ndarray, kind: str, ranges: np.ndarray | None) -> np.ndarray:
    """``values`` (n, dim) float32 as ``kind``; ``ranges`` (2, dim): per-dimension min, max (int8, uint8)."""
    if kind == "float":
        return values
    if kind in ("int8", "uint8"):
        if ranges is None:
            raise InvalidRequestError(
                f"embedding type {kind!r} needs the model's calibrated ranges (manifest "
                "quantization.ranges); this model has none",
                "embedding_types",
            )
        ranges = ranges.astype(np.float32, copy=False)
        starts = ranges[0]
        steps = (ranges[1] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((values - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if kind == "uint8" else (buckets - 128).astype(np.int8)
    if kind in ("binary", "ubinary"):
        packed = np.packbits(values > 0, axis=-1)
        return packed if kind == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    raise InvalidRequestError(
        f"unknown embedding type {kind!r}; known: {', '.join(EMBEDDING_TYPES)}", "embedding_types"
    )


def calibration_ranges(embeddings: np.ndarray) -> np.ndarray:
    """Per-dimension (min, max) over a calibration set, as sentence-transformers computes them."""
    if embeddings.ndim != 2 or len(embeddings) < 2:
        raise ValueError("calibration needs a 2-D array of at least two embeddings")
    return np.vstack((embeddings.min(axis=0), embeddings.max(axis=0))).astype(np.float32)
