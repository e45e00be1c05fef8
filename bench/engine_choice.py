"""Which continuous-batching engine, measured: this project's loop against transformers' own, in one run.

    .venv/bin/python -m bench.engine_choice --model-dir .bench/models/gpt2-small/1 --batch 8,32

The same random-weight GPT-2-small-shaped model, the same prompts (10-120 tokens) and 64 greedy new tokens
each, all submitted at once: ``deployments.runtime.generate.engine.Engine`` (a ``DynamicCache`` per batch,
rows left-padded) against ``model.generate_batch`` (transformers' paged-attention cache and scheduler, what
``transformers serve --continuous-batching`` runs), its manager kept and warmed before the measured runs as a
server keeps it. Each engine runs twice per batch size, alternating.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from deployments.runtime.generate.engine import Engine, EngineLimits, TokenEvent
from deployments.runtime.generate.sampling import Sampling

NEW_TOKENS = 64


def _prompts(batch: int, vocab: int) -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(10, 120))] for _ in range(batch)]


def own(model: PreTrainedModel, prompts: list[list[int]]) -> float:
    engine = Engine(model, (), EngineLimits(max_running=len(prompts), kv_cache_tokens=10**6))
    done = threading.Semaphore(0)

    def sink(event: TokenEvent) -> None:
        if event.finish is not None:
            done.release()

    engine.start()
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.submit(str(i), prompt, NEW_TOKENS, Sampling(), sink)
    for _ in prompts:
        done.acquire()
    elapsed = time.perf_counter() - start
    engine.stop()
    return elapsed


def transformers_cb(model: PreTrainedModel, prompts: list[list[int]]) -> float:
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    # A persistent manager, as a server keeps it: sized and warmed by the first (unmeasured) call.
    out = model.generate_batch(
        prompts, generation_config=config, max_new_tokens=NEW_TOKENS, persistent_manager=True
    )
    elapsed = time.perf_counter() - start
    assert all(len(o.generated_tokens) == NEW_TOKENS for o in out.values())
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--batch", default="8,32")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16

    def load() -> PreTrainedModel:
        return AutoModelForCausalLM.from_pretrained(
            args.model_dir, dtype=dtype, attn_implementation="sdpa"
        ).eval()

    # One copy each: transformers' manager switches its model to paged attention for as long as it lives.
    model, cb_model = load(), load()
    print("| engine | dtype | requests | output tokens/s (run 1, run 2) |\n|---|---|---|---|")
    for batch in (int(b) for b in args.batch.split(",")):
        prompts = _prompts(batch, model.config.vocab_size)
        own(model, prompts[:2])  # warm up both paths once
        transformers_cb(cb_model, prompts)
        rates: dict[str, list[float]] = {"this project's loop": [], "transformers generate_batch": []}
        with torch.inference_mode():
            for _ in range(2):
                rates["this project's loop"].append(batch * NEW_TOKENS / own(model, prompts))
                rates["transformers generate_batch"].append(
                    batch * NEW_TOKENS / transformers_cb(cb_model, prompts)
                )
        cb_model.destroy_cached_continuous_batching_manager()
        for name, values in rates.items():
            shown = ", ".join(f"{v:.1f}" for v in values)
            print(f"| {name} | {args.dtype} | {batch} | {shown} |", flush=True)


if __name__ == "__main__":
    main()
