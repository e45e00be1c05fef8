"""Which kernels the generation engine runs on, measured: PyTorch's default (MKL's sgemm on the model's own
weights, one SDPA call over the padded batch), oneDNN on weights packed once
(``deployments.runtime.generate.packed``), and packed plus decode attention by groups of rows of similar
length (``deployments.runtime.generate.row_attention``): the service's engine.

    .venv/bin/python -m bench.engine_kernels --model-dir .bench/models/gpt2-small/1

In one run, on the same model (fp32) and machine:
1. one decode step of the running batch, 8 and 32 rows of 30-420 cached tokens (mixed, as the benchmark's
   prompts and outputs make them), the variants alternating step by step (median of 20 steps each);
2. the engine end to end: mixed-length prompts (10-200 tokens) all submitted at once, 48 greedy tokens
   each, output tokens/s, each kernel run twice, alternating;
3. parity: each prompt's greedy tokens from (2) against ``model.generate(do_sample=False)`` for that
   prompt alone, on the unpacked model: the count that match token for token.
"""

from __future__ import annotations

import argparse
import copy
import random
import threading
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from deployments.runtime.generate.engine import Engine, EngineLimits, TokenEvent
from deployments.runtime.generate.kv_batch import KVBatch
from deployments.runtime.generate.packed import PackedLinear, pack_linears
from deployments.runtime.generate.passes import decode_step
from deployments.runtime.generate.row_attention import use_row_groups
from deployments.runtime.generate.sampling import Sampling
from deployments.runtime.openmp import on_passing_thread

NEW_TOKENS = 48


def prompts(count: int, vocab: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(10, 200))] for _ in range(count)]


def _batch(model: PreTrainedModel, rows: int) -> KVBatch:
    """``rows`` sequences of 30-420 cached tokens (the same for every variant)."""
    rng = random.Random(rows)
    batch = KVBatch("cpu")
    for _ in range(rows):
        n = rng.randint(30, 420)
        cache = DynamicCache(config=model.config)
        ids = torch.tensor([[rng.randrange(1, model.config.vocab_size) for _ in range(n)]])
        model(
            input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, use_cache=True, logits_to_keep=1
        )
        batch.add(cache, n)
    return batch


@torch.inference_mode()
def decode_step_ms(models: dict[str, PreTrainedModel], rows: int, steps: int = 20) -> dict[str, float]:
    """Median milliseconds of one decode step of each model over its own copy of the same batch, the
    models taking turns step by step (so a slow stretch of the machine falls on all of them)."""
    batches = {name: _batch(model, rows) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    ids = torch.randint(1, 1000, (rows, 1))
    for i in range(steps + 3):
        for name, model in models.items():
            t0 = time.perf_counter()
            decode_step(model, batches[name], ids)
            if i >= 3:  # the first steps grow the buffers
                times[name].append(time.perf_counter() - t0)
    return {name: 1000 * sorted(t)[len(t) // 2] for name, t in times.items()}


def engine_run(model: PreTrainedModel, batch: list[list[int]]) -> tuple[float, dict[str, list[int]]]:
    """Seconds for every prompt's NEW_TOKENS greedy tokens through the engine, and the tokens."""
    engine = Engine(model, (), EngineLimits(max_running=len(batch), kv_cache_tokens=10**6))
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(batch))}
    done = threading.Semaphore(0)

    def sink(event: TokenEvent) -> None:
        if event.token_id is not None:
            tokens[event.request_id].append(event.token_id)
        if event.finish is not None:
            done.release()

    engine.start()
    start = time.perf_counter()
    for i, prompt in enumerate(batch):
        engine.submit(str(i), prompt, NEW_TOKENS, Sampling(), sink)
    for _ in batch:
        done.acquire()
    elapsed = time.perf_counter() - start
    engine.stop()
    return elapsed, tokens


@torch.inference_mode()
def reference(model: PreTrainedModel, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=16, help="prompts submitted at once in (2)")
    ns = parser.parse_args()
    torch.manual_seed(0)

    def setup() -> dict[str, PreTrainedModel]:
        plain = AutoModelForCausalLM.from_pretrained(ns.model_dir, dtype=torch.float32).eval()
        packed, service = copy.deepcopy(plain), copy.deepcopy(plain)
        pack_linears(packed)
        pack_linears(service)
        assert use_row_groups(service), "the model could not switch to grouped decode attention"
        return {"default": plain, "packed": packed, "packed + row groups": service}

    # Torch runs only on threads that end and on the engine's, as in the service (runtime/openmp.py).
    models = on_passing_thread(setup)
    plain = models["default"]
    swapped = sum(isinstance(m, PackedLinear) for m in models["packed"].modules())
    print(f"model {ns.model_dir}: {swapped} linear layers packed; {torch.get_num_threads()} threads")
    print("| decode step, rows | " + " | ".join(f"{n} ms" for n in models) + " |")
    print("|---|" + "---|" * len(models))
    for rows in (8, 32):
        ms = on_passing_thread(lambda rows=rows: decode_step_ms(models, rows))
        print(f"| {rows} | " + " | ".join(f"{ms[n]:.1f}" for n in models) + " |")
    batch = prompts(ns.requests, plain.config.vocab_size)
    runs: dict[str, list[float]] = {name: [] for name in models}
    outputs: dict[str, dict[str, list[int]]] = {}
    for _ in range(2):
        for name, model in models.items():
            seconds, outputs[name] = engine_run(model, batch)
            runs[name].append(len(batch) * NEW_TOKENS / seconds)
    print(f"\n| engine, {len(batch)} prompts x {NEW_TOKENS} tokens | output tokens/s (run 1, run 2) |")
    print("|---|---|")
    for name, rates in runs.items():
        print(f"| {name} | {rates[0]:.1f}, {rates[1]:.1f} |")
    expected = on_passing_thread(lambda: [reference(plain, p) for p in batch])
    for name, got in outputs.items():
        same = sum(got[str(i)] == want for i, want in enumerate(expected))
        print(f"parity, {name}: {same} of {len(batch)} prompts equal model.generate's {NEW_TOKENS} tokens")


if __name__ == "__main__":
    main()
