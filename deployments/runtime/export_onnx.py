"""Export a model directory to an ONNX model directory with its own manifest.

    python -m deployments.runtime.export_onnx --model models/all-MiniLM-L6-v2/1    # writes .../1/onnx/
    python -m deployments.runtime.export_onnx --model models/all-MiniLM-L6-v2/1 --precision fp16  # onnx-fp16/

Pooling (over real tokens only), normalization or softmax are part of the exported graph, so the
ONNX model returns exactly what users receive; the export is verified against torch before it is kept.
An fp16 export is the fp32 graph converted by ONNX Runtime's own float16 tool, with int64 inputs and a
float32 output kept (``keep_io_types``), so callers see no difference but the precision.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from deployments.config import onnx_subdir
from deployments.repository.manifest import ONNX_FILE, ResolvedModel, load_manifest, sha256_of, weights_dir_of
from deployments.repository.weights_check import check_weights
from deployments.runtime.torch_graph import pool

# Files a model directory may carry besides the weights: tokenizer, configs, sentence-transformers layout.
SIDE_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
PARITY_MIN_COSINE = {"fp32": 0.9999, "fp16": 0.999}  # against torch in fp32


class _EmbedHead(torch.nn.Module):
    # transformers 5 rejects positional export args, so the wrapped model is called with keywords.
    def __init__(self, model: torch.nn.Module, pooling: str | None, normalize: bool) -> None:
        super().__init__()
        self.model, self.pooling, self.normalize = model, pooling, normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return pool(hidden, attention_mask, self.pooling, self.normalize)


class _ClassifyHead(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return torch.softmax(logits, dim=-1)


def _step(n: int, total: int, what: str) -> float:
    print(f"[{n}/{total}] {what}", flush=True)
    return time.perf_counter()


def export(
    model_dir: Path, out_dir: Path, opset: int = 17, version: str | None = None, precision: str = "fp32"
) -> Path:
    """Export ``model_dir`` (holding manifest.json) to ``out_dir``; return the new manifest path."""
    if precision not in PARITY_MIN_COSINE:
        raise SystemExit(f"precision {precision!r}: ONNX exports are {' or '.join(PARITY_MIN_COSINE)}")
    total = 5
    t0 = _step(1, total, f"checking {model_dir / 'manifest.json'}")
    manifest_path = (model_dir / "manifest.json").resolve()
    manifest = load_manifest(manifest_path)
    if manifest.format != "transformers":
        raise SystemExit(f"{manifest_path}: already format {manifest.format!r}")
    if manifest.task not in ("embed", "classify"):
        raise SystemExit(f"{manifest_path}: task {manifest.task!r} is served by the torch backend only")
    weights = weights_dir_of(manifest, manifest_path)
    check_weights(manifest, weights, manifest_path, hash_files=True)

    _step(2, total, f"loading {manifest.name} v{manifest.version} from {weights}")
    if manifest.task == "embed":
        head: torch.nn.Module = _EmbedHead(
            AutoModel.from_pretrained(str(weights), attn_implementation="eager"),
            manifest.pooling,
            manifest.normalize,
        )
    else:
        head = _ClassifyHead(
            AutoModelForSequenceClassification.from_pretrained(str(weights), attn_implementation="eager")
        )
    head.eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    _step(3, total, f"exporting to {out_dir / ONNX_FILE} (opset {opset})")
    ids = torch.tensor([[101, 2023, 2003, 102, 0], [101, 2178, 102, 0, 0]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    with torch.inference_mode():
        torch.onnx.export(
            head,
            (ids, mask),
            str(out_dir / ONNX_FILE),
            input_names=["input_ids", "attention_mask"],
            output_names=["output"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "sequence"},
                "attention_mask": {0: "batch", 1: "sequence"},
                "output": {0: "batch"},
            },
            opset_version=opset,
            dynamo=False,
        )
    if precision == "fp16":
        to_fp16(out_dir / ONNX_FILE)
    for name in SIDE_FILES:
        if (weights / name).is_file():
            (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(weights / name, out_dir / name)

    _step(4, total, "writing manifest with checksums")
    new_manifest = manifest.model_copy(
        update={
            "format": "onnx",
            "precision": precision,
            "weights": ".",
            "version": version or manifest.version,
            "files": {
                ONNX_FILE: sha256_of(out_dir / ONNX_FILE),
                "tokenizer.json": sha256_of(out_dir / "tokenizer.json"),
            },
        }
    )
    new_path = out_dir / "manifest.json"
    new_path.write_text(json.dumps(new_manifest.model_dump(mode="json"), indent=2) + "\n")

    _step(5, total, "verifying ONNX Runtime against torch")
    worst = verify(ResolvedModel(new_manifest, new_path, out_dir), head)
    print(
        f"done in {time.perf_counter() - t0:.1f} s: lowest cosine vs torch {worst:.6f} -> {new_path}",
        flush=True,
    )
    return new_path


def to_fp16(path: Path) -> None:
    """Convert the graph at ``path`` to fp16 in place; its inputs and output keep their types."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(path))


def verify(onnx_model: ResolvedModel, head: torch.nn.Module) -> float:
    """Cosine between ONNX Runtime and torch outputs on padded batches of mixed lengths."""
    from deployments.runtime.onnx_runner import OnnxRunner

    runner = OnnxRunner(onnx_model, "cpu", pad_id=0)
    rng = np.random.default_rng(0)
    lengths = [1, 2, 7, 33, 128, onnx_model.manifest.input.max_tokens]
    seqs = [np.concatenate([[101], rng.integers(1000, 20000, max(0, n - 2)), [102]])[:n] for n in lengths]
    ids, mask = runner._pad(seqs, max(lengths))
    got = runner._forward(ids, mask)
    with torch.inference_mode():
        want = head(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    worst = float(cos.min())
    need = PARITY_MIN_COSINE[onnx_model.manifest.precision]
    if worst < need:
        raise SystemExit(f"ONNX export differs from torch: lowest cosine {worst:.6f} < {need}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a model directory to ONNX with its manifest.")
    parser.add_argument("--model", type=Path, required=True, help="directory holding manifest.json")
    parser.add_argument(
        "--out", type=Path, default=None, help="new model directory (default: <model>/onnx, or onnx-fp16)"
    )
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--version", default=None, help="version for the new manifest (default: unchanged)")
    parser.add_argument("--precision", choices=sorted(PARITY_MIN_COSINE), default="fp32")
    ns = parser.parse_args(argv)
    export(ns.model, ns.out or ns.model / onnx_subdir(ns.precision), ns.opset, ns.version, ns.precision)
    return 0


if __name__ == "__main__":
    sys.exit(main())
