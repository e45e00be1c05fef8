"""Train a target and a draft causal LM for speculative decoding into the model repository, offline.

    python -m deployments.tools.demo_pair                          # into models/, skips what checks out
    python -m deployments.tools.demo_pair --repository .bench/models
    python -m deployments.tools.demo_pair --repository /tmp/repo --force --steps 50

``demo-spec-target`` and ``demo-spec-draft`` are GPT-2s (``GPT2LMHeadModel``, fp32) trained here from fixed
seeds on a synthetic corpus with real structure (``demo_pair_corpus``: counting, fixed sequences, facts about
an invented world, records summarised, phrases repeated, times tables), with one byte-level BPE tokenizer
trained on that corpus and shared by both: demo_lm's special tokens (``<|endoftext|>`` id 0: bos, eos and pad,
``<|im_start|>``, ``<|im_end|>``) and ChatML chat template. The corpus is one-turn chats in that template, so
the pair answers chat requests; ``<|im_end|>`` ends a reply (an EOS in generation_config.json). The draft
costs a fraction of the target per decode step, and the two agree on most greedy next tokens: the pair
speculative decoding wants. At the end it prints the parameter counts, the final training losses, the draft's
greedy agreement with the target on held-out prompts and each model's ms per decode step at batch 1 (KV
cache).

Both are skipped when they check out (demo_lm's ``stale_reason``, sums included, the training recipe recorded
under ``demo_pair`` in config.json, one tokenizer); ``--force`` rebuilds. Training is seeded, but the weights'
bytes may differ between machines (kernels, bfloat16 autocast where the CPU has AMX; the weights are fp32).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.config import resolve_path
from deployments.repository.manifest import read_json
from deployments.tools import demo_lm
from deployments.tools.demo_lm import LMSpec
from deployments.tools.demo_models import VERSION, _quiet
from deployments.tools.demo_pair_corpus import chat, corpus, prompts
from deployments.tools.demo_pair_train import agreement, step_ms, train

__all__ = ["DEFAULT", "PAIR", "Recipe", "build", "corpus", "main", "prompts", "stale_reason"]

NOTICE = "trained in minutes on a synthetic corpus (deployments/tools/demo_pair_corpus.py): a demo model"
VOCAB = 768
TARGET = LMSpec("demo-spec-target", "gpt2", VOCAB, 512, 8, 512, seed=21, layers=8)
DRAFT = LMSpec("demo-spec-draft", "gpt2", VOCAB, 128, 4, 512, seed=22, layers=2)
PAIR = (TARGET, DRAFT)


@dataclass(frozen=True, slots=True)
class Recipe:
    """How the pair is trained, recorded in each config.json (``demo_pair``): a change makes a build stale."""

    steps: int = 600  # the target's AdamW steps (--steps)
    draft_steps: int = 600  # the draft's, first: it learns the corpus in a minute
    batch: int = 8
    seq: int = 256  # training windows, each from a document's start: a prompt and a long answer fit
    lr: float = 2e-3
    draft_lr: float = 4e-3
    mix: float = 0.5  # the target's loss: (1 - mix) corpus cross-entropy + mix KL to the trained draft
    warmup: int = 20
    documents: int = 30000
    corpus_seed: int = 1
    corpus_version: int = 2  # demo_pair_corpus's documents: one more when they change (2: one-turn chats)
    # The measurement (not recorded): held-out prompts, and the target's greedy answer length.
    eval_prompts: int = 32
    eval_seed: int = 2
    eval_tokens: int = 64

    def record(self, role: str) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        for key in ("eval_prompts", "eval_seed", "eval_tokens"):
            del fields[key]
        return fields | {"role": role}


DEFAULT = Recipe()


def stale_reason(spec: LMSpec, target: Path, recipe: Recipe, role: str) -> str | None:
    """Why ``target`` is not a current build of ``spec`` by ``recipe`` (None: it checks out)."""
    if (reason := demo_lm.stale_reason(spec, target)) is not None:
        return reason
    if read_json(target / "config.json").get("demo_pair") != recipe.record(role):
        return f"{target / 'config.json'}: demo_pair differs from the recipe"
    return None


def build(
    repository: Path,
    *,
    force: bool = False,
    recipe: Recipe = DEFAULT,
    specs: tuple[LMSpec, LMSpec] = PAIR,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train the pair into ``<repository>/<name>/1/`` unless both check out; return (and log) the figures."""
    target, draft = specs
    if target.vocab != draft.vocab:
        raise ValueError("the target and the draft share one tokenizer: give them one vocabulary size")
    dirs = [repository / spec.name / VERSION for spec in specs]
    reasons = [
        None if force else stale_reason(s, d, recipe, r) for s, d, r in zip(specs, dirs, ROLES, strict=True)
    ]
    if not force and not any(reasons):
        if (dirs[0] / "tokenizer.json").read_bytes() == (dirs[1] / "tokenizer.json").read_bytes():
            for spec, d in zip(specs, dirs, strict=True):
                params = demo_lm.parameter_count(d / "model.safetensors")
                log(f"kept  {spec.name} v{VERSION}: {params:,} parameters, checks out -> {d}")
            return {"built": False}
        reasons[1] = "its tokenizer differs from the target's"
    why = [
        "forced" if force else "new" if not d.exists() else f"rebuilt: {r}"
        for d, r in zip(dirs, reasons, strict=True)
    ]
    t0 = time.perf_counter()
    texts = corpus(recipe.documents, recipe.corpus_seed)
    tokenizer_json = train_tokenizer(target.vocab, tuple(texts))
    stream = _encode(tokenizer_json, texts)
    log(
        f"corpus: {len(texts):,} documents, {sum(map(len, stream)):,} tokens; "
        f"tokenizer: {target.vocab} tokens ({time.perf_counter() - t0:.0f} s)"
    )
    result: dict[str, Any] = {"built": True, "params": [0, 0], "loss": [0.0, 0.0], "train_s": [0.0, 0.0]}
    models: list[Any] = [None, None]
    with _silent():
        # The draft first, on the corpus; then the target on the corpus and the draft's predictions: a few
        # hundred steps of the target learn faster from them, and the two come to agree.
        for i, spec, steps, lr in (
            (1, draft, recipe.draft_steps, recipe.draft_lr),
            (0, target, recipe.steps, recipe.lr),
        ):
            t = time.perf_counter()
            teacher = {"teacher": models[1], "mix": recipe.mix} if i == 0 and recipe.mix > 0 else {}
            models[i], loss = train(
                spec, stream, recipe.batch, recipe.seq, steps, lr, recipe.warmup, log=log, **teacher
            )
            result["params"][i] = sum(p.numel() for p in models[i].parameters())
            result["loss"][i] = loss
            result["train_s"][i] = time.perf_counter() - t
        ask = [chat(p) for p in prompts(recipe.eval_prompts, recipe.eval_seed)]
        result["agreement"] = agreement(*models, tokenizer_json, ask, recipe.eval_tokens)
        result["step_ms"] = step_ms(models)
        for spec, d, model, role in zip(specs, dirs, models, ROLES, strict=True):
            with _quiet():  # save_pretrained's prints
                _write(spec, d, model, tokenizer_json, recipe.record(role))
    result["seconds"] = time.perf_counter() - t0
    for i, spec in enumerate(specs):
        steps = (recipe.steps, recipe.draft_steps)[i]
        what = f"{result['params'][i]:,} parameters ({spec.layers} layers, {spec.hidden} wide)"
        what += f", {steps} steps in {result['train_s'][i]:.0f} s, final loss {result['loss'][i]:.3f}"
        log(f"built {spec.name} v{VERSION} ({why[i]}): {what} -> {dirs[i]}")
    log(
        f"greedy agreement: {result['agreement']:.3f} of the target's next tokens are the draft's argmax "
        f"({recipe.eval_prompts} held-out prompts, up to {recipe.eval_tokens} tokens each)"
    )
    ms = result["step_ms"]
    log(f"decode step, batch 1, KV cache: target {ms[0]:.2f} ms, draft {ms[1]:.2f} ms ({ms[0] / ms[1]:.1f}x)")
    log(f"took {result['seconds']:.0f} s")
    return result


ROLES = ("target", "draft")


@functools.lru_cache(maxsize=2)
def train_tokenizer(vocab: int, texts: tuple[str, ...]) -> str:
    """demo_lm's byte-level BPE of exactly ``vocab`` tokens, trained on this corpus, not Python's text."""
    return demo_lm.bpe_tokenizer(vocab, texts)


def _encode(tokenizer_json: str, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    return [[*enc.ids, 0] for enc in tokenizer.encode_batch(texts)]  # each document ends in <|endoftext|>


@contextlib.contextmanager
def _silent() -> Iterator[None]:
    """transformers' advice (loss_type, attention masks) and warnings left unsaid; stdout stays (the log)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)


def _write(spec: LMSpec, target: Path, model: Any, tokenizer_json: str, record: dict[str, Any]) -> None:
    """The model directory demo_lm writes (same files, manifest and tokenizer config), trained weights."""
    if target.exists():
        shutil.rmtree(target)  # only ever <repository>/<name>/1: the model's own directory
    target.mkdir(parents=True)
    demo_lm.write_tokenizer(spec, target, tokenizer_json)
    model.config.demo_pair = record
    model.save_pretrained(target)  # model.safetensors, config.json, generation_config.json
    demo_lm.write_card(spec, target, NOTICE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train the speculative-decoding demo pair (target and draft)."
    )
    parser.add_argument("--repository", default="models", help="model repository root (default: models)")
    parser.add_argument("--force", action="store_true", help="rebuild even when both models check out")
    parser.add_argument(
        "--steps",
        type=int,
        help=f"the target's training steps, the draft's in proportion (default {DEFAULT.steps} and "
        f"{DEFAULT.draft_steps})",
    )
    ns = parser.parse_args(argv)
    recipe = DEFAULT
    if ns.steps is not None:
        draft_steps = max(1, round(ns.steps * DEFAULT.draft_steps / DEFAULT.steps))
        recipe = dataclasses.replace(DEFAULT, steps=ns.steps, draft_steps=draft_steps)
    build(resolve_path(ns.repository), force=ns.force, recipe=recipe, specs=PAIR, log=_say)
    return 0


def _say(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
