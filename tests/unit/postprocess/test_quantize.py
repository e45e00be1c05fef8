"""Compact embeddings against sentence-transformers' quantize_embeddings on the same vectors."""

from __future__ import annotations

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from contracts.errors import InvalidRequestError
from postprocess.quantize import EMBEDDING_TYPES, calibration_ranges, quantize


@pytest.fixture(scope="module")
def vectors() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(500, 384)).astype(np.float32)
    calibration /= np.linalg.norm(calibration, axis=1, keepdims=True)
    queries = rng.normal(size=(7, 384)).astype(np.float32) * 0.06  # some outside the calibrated range
    return calibration, queries


@pytest.mark.parametrize("kind", ["int8", "uint8", "binary", "ubinary"])
def test_equal_to_sentence_transformers(vectors, kind):
    calibration, values = vectors
    ranges = calibration_ranges(calibration)
    want = quantize_embeddings(values, precision=kind, ranges=ranges)
    got = quantize(values, kind, ranges)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_ranges_equal_sentence_transformers_calibration(vectors):
    calibration, values = vectors
    want = quantize_embeddings(values, precision="int8", calibration_embeddings=calibration)
    np.testing.assert_array_equal(quantize(values, "int8", calibration_ranges(calibration)), want)


def test_float_is_untouched_and_int8_needs_ranges(vectors):
    _, values = vectors
    assert quantize(values, "float", None) is values
    with pytest.raises(InvalidRequestError, match="calibrated ranges"):
        quantize(values, "int8", None)
    with pytest.raises(InvalidRequestError, match="unknown embedding type"):
        quantize(values, "int4", None)
    assert set(EMBEDDING_TYPES) == {"float", "int8", "uint8", "binary", "ubinary"}


def test_binary_packs_eight_dimensions_per_byte(vectors):
    _, values = vectors
    assert quantize(values, "ubinary", None).shape == (7, 48)
