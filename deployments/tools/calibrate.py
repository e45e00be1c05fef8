"""Calibrate a model's int8/uint8 embedding ranges and record them in its manifest.

    python -m deployments.tools.calibrate --model models/all-MiniLM-L6-v2/1
    python -m deployments.tools.calibrate --model models/demo-mini-embedder/1 --texts 500

Compact embeddings (``embedding_types`` int8 and uint8) cut each dimension into 256 buckets between its
minimum and maximum over a calibration set (sentence-transformers' ``quantize_embeddings``). Computing
them per request would make one text's int8 vector depend on the other texts it arrived with, so they
are computed once here, over the benchmark's corpus of real English prose (``deployments/tools/corpus.py``,
built from the Python docs, offline), with the model in fp32, and written to ``quantization.ranges``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from deployments.repository.manifest import ResolvedModel, load_manifest, weights_dir_of
from deployments.runtime.backends import create_runner
from deployments.tools.corpus import build_corpus
from postprocess.quantize import calibration_ranges
from preprocess.tokenize import TextTokenizer

DEFAULT_TEXTS = 1000
DECIMALS = (
    6  # the ranges as written (and read back): the JSON stays readable, the buckets unchanged in effect
)


def embed_corpus(model: ResolvedModel, texts: list[str]) -> np.ndarray:
    tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    encoded = tokenizer.encode(texts, truncate=True)
    runner = create_runner(model, "cpu")
    return runner.run(list(encoded.sequences())).values


def calibrate(model_dir: Path, count: int = DEFAULT_TEXTS) -> np.ndarray:
    """Write ``quantization`` into ``model_dir``'s manifest.json; return the ranges written."""
    path = (model_dir / "manifest.json").resolve()
    manifest = load_manifest(path)
    if manifest.task != "embed":
        raise SystemExit(f"{path}: task {manifest.task!r}; only embedding models have int8 ranges")
    model = ResolvedModel(manifest, path, weights_dir_of(manifest, path))
    corpus = build_corpus(seed=0, limit=count)
    ranges = np.round(
        calibration_ranges(embed_corpus(model, list(corpus.texts))).astype(np.float64), DECIMALS
    )
    data = json.loads(path.read_text(encoding="utf-8"))
    data["quantization"] = {
        "ranges": ranges.tolist(),
        "corpus": f"{len(corpus)} texts of deployments/tools/corpus.py (seed 0), fp32",
    }
    path.write_text(dumps_manifest(data), encoding="utf-8")
    load_manifest(path)  # what was written must load
    return ranges


def dumps_manifest(data: dict[str, object]) -> str:
    """Indented JSON with each row of ranges on one line (hundreds of numbers, not hundreds of lines)."""
    quantization = data.get("quantization")
    if not isinstance(quantization, dict):
        return json.dumps(data, indent=2) + "\n"
    rows = quantization["ranges"]
    marked = {**data, "quantization": {**quantization, "ranges": ["@ROW0@", "@ROW1@"]}}
    text = json.dumps(marked, indent=2) + "\n"
    for i, row in enumerate(rows):
        text = text.replace(f'"@ROW{i}@"', json.dumps(row))
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Calibrate a model's int8 embedding ranges into its manifest."
    )
    parser.add_argument("--model", type=Path, required=True, help="version directory holding manifest.json")
    parser.add_argument("--texts", type=int, default=DEFAULT_TEXTS, help="calibration texts (default 1000)")
    ns = parser.parse_args(argv)
    ranges = calibrate(ns.model, ns.texts)
    print(f"calibrated {ranges.shape[1]} dimensions over {ns.texts} texts -> {ns.model / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
