"""Build small demo models into the model repository, offline: random weights, fixed seed.

    python -m deployments.tools.demo_models                   # into models/, skips what checks out
    python -m deployments.tools.demo_models --repository /tmp/repo --force --no-onnx

Each demo is a 2-layer BERT with the tokenizer of the default model (all-MiniLM-L6-v2) copied in, so
nothing is downloaded; its manifest is written in the schema the service checks (``manifest.py``),
and an ONNX export goes into ``<version>/onnx/`` for backend onnx. The weights are random: a demo
model's outputs mean nothing; it exists to try a multi-model config on a fresh clone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from deployments.config import ONNX_SUBDIR, PROJECT_ROOT, resolve_path
from deployments.repository.manifest import (
    Manifest,
    ManifestError,
    load_manifest,
    sha256_of,
    weights_dir_of,
)
from deployments.repository.weights_check import check_weights

VERSION = "1"
DEFAULT_MODEL_DIR = PROJECT_ROOT / "models" / "all-MiniLM-L6-v2" / "1"  # its tokenizer is reused
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
NOTICE = "random weights: a demo model, its outputs mean nothing"
_ST = "sentence_transformers.models."


@dataclass(frozen=True, slots=True)
class DemoSpec:
    name: str
    task: str  # embed | classify | rerank (a cross-encoder) | sparse_embed (SPLADE)
    hidden: int
    heads: int
    max_tokens: int
    seed: int
    labels: tuple[str, ...] = ()
    layers: int = 2
    prompts: tuple[tuple[str, str], ...] = ()  # embed: named prompts, as sentence-transformers stores them
    matryoshka: tuple[int, ...] | None = None  # embed: declared (a demo was not trained for them)
    calibrate: bool = False  # embed: int8 ranges in the manifest
    onnx: bool = True  # the ONNX export covers embed and classify
    init_range: float = 0.02  # BERT's default; wider makes random outputs differ enough to compare scores

    @property
    def output(self) -> dict[str, object]:
        if self.task == "classify":
            return {"labels": list(self.labels)}
        if self.task == "rerank":
            return {}
        return {"dimension": VOCAB_SIZE if self.task == "sparse_embed" else self.hidden}


VOCAB_SIZE = 30522  # the default model's tokenizer, which every demo reuses
QUERY_PROMPTS = (("document", "passage: "), ("query", "query: "))

DEMOS = (
    DemoSpec("demo-sentiment-classifier", "classify", 128, 2, 128, 1, ("negative", "neutral", "positive")),
    DemoSpec(
        "demo-mini-embedder",
        "embed",
        256,
        4,
        256,
        2,
        prompts=QUERY_PROMPTS,
        matryoshka=(64, 128),
        calibrate=True,
    ),
    DemoSpec("demo-cross-encoder", "rerank", 128, 2, 256, 3, onnx=False, init_range=0.2),
    DemoSpec("demo-splade", "sparse_embed", 128, 2, 128, 4, onnx=False),
)


def stale_reason(spec: DemoSpec, target: Path, onnx: bool) -> str | None:
    """Why ``target`` is not a current build of ``spec`` (None: it checks out, sha256 sums included)."""
    dirs = [target, target / ONNX_SUBDIR] if onnx and spec.onnx else [target]
    for d in dirs:
        try:
            path = d / "manifest.json"
            manifest = load_manifest(path)
            check_weights(manifest, weights_dir_of(manifest, path), path, hash_files=True)
        except ManifestError as exc:
            return str(exc)
        if (differs := _differs(spec, manifest)) is not None:
            return f"{path}: {differs} differs from the demo's spec"
    return None


def _differs(spec: DemoSpec, manifest: Manifest) -> str | None:
    out = manifest.output
    have = {"name": manifest.name, "version": manifest.version, "task": manifest.task}
    have |= {"max_tokens": manifest.input.max_tokens, "dimension": out.dimension, "labels": out.labels}
    want = {"name": spec.name, "version": VERSION, "task": spec.task, "max_tokens": spec.max_tokens}
    want |= {"dimension": spec.output.get("dimension"), "labels": spec.labels or None}
    have |= {"prompts": manifest.prompts, "matryoshka": manifest.matryoshka_dimensions}
    have["calibrated"] = manifest.quantization is not None
    want |= {"prompts": dict(spec.prompts), "matryoshka": spec.matryoshka, "calibrated": spec.calibrate}
    return next((k for k in want if want[k] != have[k]), None)


def build(
    spec: DemoSpec,
    repository: Path,
    *,
    force: bool = False,
    onnx: bool = True,
    source: Path = DEFAULT_MODEL_DIR,
) -> str:
    """Build ``spec`` into ``<repository>/<name>/1/`` unless it checks out already; say what was done."""
    target = repository / spec.name / VERSION
    if not force and (reason := stale_reason(spec, target, onnx)) is None:
        return f"kept  {spec.name} v{VERSION}: {target} checks out (--force rebuilds it)"
    why = "forced" if force else ("new" if not target.exists() else f"rebuilt: {reason}")
    t0 = time.perf_counter()
    if target.exists():
        shutil.rmtree(target)  # only ever <repository>/demo-*/1: a demo model's own directory
    target.mkdir(parents=True)
    with _quiet():
        _write_weights(spec, target, _tokenizer_dir(source))
    (target / "README.md").write_text(f"# {spec.name}\n\n{NOTICE.capitalize()}.\n", encoding="utf-8")
    _write_manifest(spec, target)
    if spec.calibrate:
        from deployments.tools.calibrate import calibrate

        calibrate(target)
    if onnx and spec.onnx:
        from deployments.runtime.export_onnx import export

        with _quiet():  # its step log, tracer warnings and progress bars: a few dozen lines a model
            export(target, target / ONNX_SUBDIR)
    out = json.dumps(spec.output)
    took = time.perf_counter() - t0
    return f"built {spec.name} v{VERSION} ({why}): {spec.task} {out} -> {target} in {took:.1f} s"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _tokenizer_dir(source: Path) -> Path:
    """Where the default model's tokenizer files lie (its manifest points into the weights package)."""
    path = source / "manifest.json"
    return weights_dir_of(load_manifest(path), path)


def _write_weights(spec: DemoSpec, target: Path, tokenizer_dir: Path) -> None:
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, target / name)
    labels = {"id2label": dict(enumerate(spec.labels)), "label2id": {v: i for i, v in enumerate(spec.labels)}}
    if spec.task == "rerank":
        labels = {"num_labels": 1}
    config = BertConfig(
        vocab_size=Tokenizer.from_file(str(target / "tokenizer.json")).get_vocab_size(),
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        intermediate_size=4 * spec.hidden,
        max_position_embeddings=512,
        initializer_range=spec.init_range,
        **(labels if spec.task in ("classify", "rerank") else {}),
    )
    torch.manual_seed(spec.seed)
    classes = {"embed": BertModel, "sparse_embed": BertForMaskedLM}
    model = classes.get(spec.task, BertForSequenceClassification)(config).eval()
    if spec.task == "sparse_embed":
        _as_sparse_as_trained(model, Tokenizer.from_file(str(target / "tokenizer.json")))
    model.save_pretrained(target)
    if spec.task == "embed":  # sentence-transformers layout: the weight check reads pooling from it
        _write_json(target / "sentence_bert_config.json", {"max_seq_length": spec.max_tokens})
        pooling = {"word_embedding_dimension": spec.hidden, "pooling_mode_mean_tokens": True}
        _write_json(target / "1_Pooling" / "config.json", pooling | {"pooling_mode_cls_token": False})
        modules = [("Transformer", ""), ("Pooling", "1_Pooling"), ("Normalize", "2_Normalize")]
        entries = [{"idx": i, "name": str(i), "path": p, "type": _ST + t} for i, (t, p) in enumerate(modules)]
        _write_json(target / "modules.json", entries)
        st_config = {
            "prompts": dict(spec.prompts),
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        }
        _write_json(target / "config_sentence_transformers.json", st_config)


# A trained SPLADE head keeps a few hundred of the vocabulary's weights above zero per text; a random one
# keeps nearly all (30,000 a text: answers of megabytes, unlike any real model's). Its bias is shifted so
# that this share of a token's logits stays above zero: about 100-300 weights per text after max-pooling.
SPARSE_TOKEN_SHARE = 0.0005
_SAMPLE = "Sparse retrieval models weigh a few vocabulary terms per text, and most of the rest are zero."


def _as_sparse_as_trained(model: Any, tokenizer: Tokenizer) -> None:
    import torch

    ids = torch.tensor([tokenizer.encode(_SAMPLE).ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.flatten()
        shift = torch.quantile(logits, 1.0 - SPARSE_TOKEN_SHARE)
        model.cls.predictions.bias -= shift  # the decoder's bias: the same parameter


def _write_manifest(spec: DemoSpec, target: Path) -> None:
    manifest: dict[str, object] = {
        "schema_version": 1,
        "name": spec.name,
        "version": VERSION,
        "task": spec.task,
        "weights": ".",
        "input": {"tokenizer": "tokenizer.json", "max_tokens": spec.max_tokens},
        "output": spec.output,
    }
    if spec.task == "embed":
        manifest |= {"pooling": "mean", "normalize": True}
    if spec.prompts:
        manifest["prompts"] = dict(spec.prompts)
    if spec.matryoshka:
        manifest["matryoshka_dimensions"] = list(spec.matryoshka)
    if spec.task == "rerank":
        manifest["activation"] = "sigmoid"  # sentence-transformers' CrossEncoder default for one label
    files = ("model.safetensors", "config.json", "tokenizer.json")
    manifest["files"] = {f: sha256_of(target / f) for f in files}
    _write_json(target / "manifest.json", manifest)


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Build the demo models ({NOTICE}).")
    parser.add_argument("--repository", default="models", help="model repository root (default: models)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a demo checks out")
    parser.add_argument("--no-onnx", action="store_true", help="skip the ONNX export (<version>/onnx/)")
    ns = parser.parse_args(argv)
    repository = resolve_path(ns.repository)
    for spec in DEMOS:
        print(build(spec, repository, force=ns.force, onnx=not ns.no_onnx), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
