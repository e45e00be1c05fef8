"""Build small causal-LM models (task ``generate``) into the model repository, offline: random weights.

    python -m deployments.tools.demo_lm                      # demo-gpt2-lm, demo-llama-lm into models/
    python -m deployments.tools.demo_lm --repository /tmp/repo --force
    python -m deployments.tools.demo_lm --preset gpt2-small --repository .bench/models

The tokenizer is a byte-level BPE trained here, deterministically, on text that ships with Python: the
``pydoc_data.topics`` prose for the demos (4096 tokens; that text reaches 9196 at most), plus the standard
library's ``.py`` files (tests and site-packages left out, 13 MB) for ``gpt2-small``: GPT-2's 50257, in
seconds (with Python 3.11 that text reaches 64766). Its special tokens are ``<|endoftext|>`` (id 0: bos,
eos and pad), ``<|im_start|>`` and ``<|im_end|>``, with a ChatML chat template in ``tokenizer_config.json``.

The models are a GPT-2 and a Llama (grouped-query attention: 2 KV heads) of 2 layers, 128 wide, 512
positions (about 1 M parameters each), and the bench preset ``gpt2-small`` with GPT-2 small's shape (12
layers, 768 wide, 1024 positions: 124,439,808 parameters, 0.5 GB), all fp32 from a fixed seed; the same
Python minor version gives the same files. The weights are random (a GPT-2's init std is 0.1, see
``LMSpec.init_range``): a model's outputs mean nothing; it exists to try the generate task offline.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import struct
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from deployments.config import resolve_path
from deployments.repository.manifest import (
    ManifestError,
    load_manifest,
    read_json,
    sha256_of,
    weights_dir_of,
)
from deployments.repository.weights_check import check_weights
from deployments.tools.demo_models import NOTICE, VERSION, _quiet, _write_json

EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
Corpus = Literal["pydoc", "stdlib"]  # stdlib: pydoc topics plus the standard library's .py files
FILES = (
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


@dataclass(frozen=True, slots=True)
class LMSpec:
    name: str
    arch: Literal["gpt2", "llama"]
    vocab: int  # the tokenizer is trained to exactly this size, and the model's embeddings match it
    hidden: int
    heads: int
    positions: int  # also the manifest's input.max_tokens
    seed: int
    layers: int = 2
    kv_heads: int | None = None  # llama: grouped-query attention (None: one per head)
    intermediate: int | None = None  # the MLP's width (None: 4 * hidden)
    corpus: Corpus = "pydoc"
    # At the default 0.02 a random GPT-2 (its head tied to the embeddings) greedily repeats a token or
    # two, 2 layers or 12; 0.1 makes its output vary.
    init_range: float = 0.02

    def config_fields(self) -> dict[str, int | float]:
        """The model config's shape and init, under the architecture's own names (config.json)."""
        return self._shape() | {"initializer_range": self.init_range}

    def _shape(self) -> dict[str, int]:
        if self.arch == "gpt2":
            shape = {"n_layer": self.layers, "n_embd": self.hidden, "n_head": self.heads}
            return shape | {"n_positions": self.positions, "vocab_size": self.vocab}
        return {
            "num_hidden_layers": self.layers,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate or 4 * self.hidden,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads or self.heads,
            "max_position_embeddings": self.positions,
            "vocab_size": self.vocab,
        }


DEMOS = (
    LMSpec("demo-gpt2-lm", "gpt2", 4096, 128, 4, 512, seed=11, init_range=0.1),
    LMSpec("demo-llama-lm", "llama", 4096, 128, 4, 512, seed=12, kv_heads=2, intermediate=256),
)
GPT2_SMALL = LMSpec(
    "gpt2-small", "gpt2", 50257, 768, 12, 1024, seed=13, layers=12, corpus="stdlib", init_range=0.1
)
PRESETS = {"demos": DEMOS, "gpt2-small": (GPT2_SMALL,)}


def stale_reason(spec: LMSpec, target: Path) -> str | None:
    """Why ``target`` is not a current build of ``spec`` (None: it checks out, sha256 sums included)."""
    path = target / "manifest.json"
    try:
        manifest = load_manifest(path)
        weights = weights_dir_of(manifest, path)
        check_weights(manifest, weights, path, hash_files=True)
    except ManifestError as exc:
        return str(exc)
    if sorted(manifest.files) != sorted(FILES):
        return f"{path}: files differs from the builder's"
    have = {"name": manifest.name, "version": manifest.version, "task": manifest.task}
    have |= {"max_tokens": manifest.input.max_tokens, "chat_template": manifest.chat_template}
    want = {"name": spec.name, "version": VERSION, "task": "generate", "max_tokens": spec.positions}
    want |= {"chat_template": True}
    config = read_json(weights / "config.json")
    have |= {k: config.get(k) for k in spec.config_fields()} | {"model_type": config.get("model_type")}
    want |= spec.config_fields() | {"model_type": spec.arch}
    differs = next((k for k in want if want[k] != have[k]), None)
    return None if differs is None else f"{path}: {differs} differs from the spec"


def build(spec: LMSpec, repository: Path, *, force: bool = False) -> str:
    """Build ``spec`` into ``<repository>/<name>/1/`` unless it checks out already; say what was done."""
    target = repository / spec.name / VERSION
    t0 = time.perf_counter()
    if not force and (reason := stale_reason(spec, target)) is None:
        took = time.perf_counter() - t0
        params = parameter_count(target / "model.safetensors")
        return f"kept  {spec.name} v{VERSION}: {params:,} parameters, checks out in {took:.1f} s -> {target}"
    why = "forced" if force else ("new" if not target.exists() else f"rebuilt: {reason}")
    if target.exists():
        shutil.rmtree(target)  # only ever <repository>/<name>/1: the model's own directory
    target.mkdir(parents=True)
    write_tokenizer(spec, target)
    with _quiet():
        _write_model(spec, target)
    write_card(spec, target, NOTICE)
    took = time.perf_counter() - t0
    params = parameter_count(target / "model.safetensors")
    what = f"{spec.arch}, {params:,} parameters, vocabulary {spec.vocab}"
    return f"built {spec.name} v{VERSION} ({why}): {what} in {took:.1f} s -> {target}"


def parameter_count(weights: Path) -> int:
    """Parameters in a safetensors file, read from its header (tied weights are stored once)."""
    with weights.open("rb") as fh:
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    return sum(_product(t["shape"]) for k, t in header.items() if k != "__metadata__")


def _product(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def corpus_texts(corpus: Corpus) -> list[str]:
    """The training text, in a fixed order: pydoc topics by key, then (stdlib) the sorted .py files."""
    from pydoc_data.topics import topics

    texts = [topics[key] for key in sorted(topics)]
    if corpus == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        skip = {"site-packages", "test", "tests", "idle_test"}
        files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
        texts += [p.read_text(encoding="utf-8", errors="replace") for p in files]
    return texts


@functools.lru_cache(maxsize=4)
def train_tokenizer(vocab: int, corpus: Corpus) -> str:
    """A byte-level BPE of exactly ``vocab`` tokens, as tokenizer.json text (the demos share one)."""
    return bpe_tokenizer(vocab, corpus_texts(corpus))


def bpe_tokenizer(vocab: int, texts: Sequence[str]) -> str:
    """A byte-level BPE of exactly ``vocab`` tokens trained on ``texts``, as tokenizer.json text, with the
    special tokens (ids 0, 1, 2), pre-tokenizer and decoder every demo LM has."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOS, IM_START, IM_END],  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    if (reached := tokenizer.get_vocab_size()) != vocab:
        raise ValueError(f"the corpus reaches a vocabulary of {reached}, not {vocab}: ask for less")
    return tokenizer.to_str()


def write_card(spec: LMSpec, target: Path, notice: str) -> None:
    """README.md (``notice``) and manifest.json (summing the model's files, written before)."""
    (target / "README.md").write_text(f"# {spec.name}\n\n{notice.capitalize()}.\n", encoding="utf-8")
    manifest = {
        "schema_version": 1,
        "name": spec.name,
        "version": VERSION,
        "task": "generate",
        "weights": ".",
        "input": {"tokenizer": "tokenizer.json", "max_tokens": spec.positions},
        "output": {},
        "chat_template": True,
        "files": {f: sha256_of(target / f) for f in FILES},
    }
    _write_json(target / "manifest.json", manifest)


def write_tokenizer(spec: LMSpec, target: Path, tokenizer_json: str | None = None) -> None:
    """tokenizer.json (``tokenizer_json``, else trained on ``spec.corpus``), tokenizer_config.json (with the
    ChatML template) and special_tokens_map.json."""
    text = tokenizer_json if tokenizer_json is not None else train_tokenizer(spec.vocab, spec.corpus)
    (target / "tokenizer.json").write_text(text, encoding="utf-8")
    special = {"bos_token": EOS, "eos_token": EOS, "pad_token": EOS, "unk_token": EOS}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special, "model_max_length": spec.positions}
    config |= {"clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}
    _write_json(target / "tokenizer_config.json", config)
    extra = {"additional_special_tokens": [IM_START, IM_END]}
    _write_json(target / "special_tokens_map.json", special | extra)


def _write_model(spec: LMSpec, target: Path) -> None:
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    if spec.arch == "gpt2":
        model_class, config = GPT2LMHeadModel, GPT2Config(**spec.config_fields(), **ids)
    else:
        model_class, config = LlamaForCausalLM, LlamaConfig(**spec.config_fields(), **ids)
    torch.manual_seed(spec.seed)
    model = model_class(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(target)  # model.safetensors, config.json, generation_config.json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Build causal-LM models ({NOTICE}).")
    parser.add_argument("--repository", default="models", help="model repository root (default: models)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demos", help="what to build")
    parser.add_argument("--force", action="store_true", help="rebuild even when a model checks out")
    ns = parser.parse_args(argv)
    repository = resolve_path(ns.repository)
    for spec in PRESETS[ns.preset]:
        print(build(spec, repository, force=ns.force), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
