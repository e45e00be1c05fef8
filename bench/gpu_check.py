"""The prepared GPU check: is the service right on one NVIDIA GPU? One command, under 10 minutes:

    python bench/gpu_check.py            # or: python -m bench.gpu_check

on a machine with one CUDA GPU (H100/H200), from the project root with the models `.ci/setup` builds
(all-MiniLM-L6-v2 and demo-gpt2-lm in models/). Each check prints PASS or FAIL with its figures; the exit
code is 1 when any fails, 2 when there is no CUDA device. Checks:

1. embed precisions: bf16 and fp16 vectors against fp32 on the same GPU (cosine >= 0.99), sentences/s each;
2. embed limit: the service's runner (backends.ready_runner) against a bare in-process torch forward at its
   best batch on the same texts (the in-process CUDA limit), as a ratio;
3. generate parity: greedy token ids on CUDA equal the CPU's; seeded sampling on CUDA repeats run to run;
4. OOM split-and-retry: a real CUDA out-of-memory on a batch (memory capped) still answers every member;
5. priority under bulk: the service on the GPU (Ray Serve, HTTP only), interactive p99 saturated by a batch
   tenant within a stated bound of interactive p99 alone (bench/gpu_check_service.py).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script (python bench/gpu_check.py): the project's packages
    sys.path.insert(0, str(ROOT))

EMBED_MODEL = "all-MiniLM-L6-v2"
GENERATE_MODEL = "demo-gpt2-lm"
MIN_COSINE = 0.99
MIN_LIMIT_RATIO = 0.5  # the service's runner reaches at least half the in-process limit
TEXTS = 2048
NO_GPU = "gpu_check: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU machine"

Check = Callable[[], tuple[bool, dict[str, Any]]]


def _texts(n: int = TEXTS) -> list[str]:
    from deployments.tools.corpus import build_corpus

    texts = list(build_corpus().texts)
    return (texts * (n // len(texts) + 1))[:n]


def _embed_model(precision: str) -> Any:
    from deployments.config import ModelConfig
    from deployments.repository.resolve import resolve_model

    config = ModelConfig(name=EMBED_MODEL, task="embed", backend="torch", precision=precision)
    return resolve_model(config, hash_files=False)


def _sequences(model: Any, texts: list[str]) -> list[Any]:
    from preprocess.tokenize import TextTokenizer

    tok = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    return list(tok.encode(texts, truncate=True).sequences())


def _rate(fn: Callable[[], Any], n: int, repeats: int = 3) -> tuple[Any, float]:
    """``fn``'s last result and the best of ``repeats`` timed runs, as ``n`` per second."""
    import torch

    best, out = float("inf"), None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return out, n / best


def _min_cosine(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
    return float(cos.min())


def check_embed_precisions() -> tuple[bool, dict[str, Any]]:
    from deployments.config import RuntimeConfig
    from deployments.runtime.backends import ready_runner

    texts, figures, vectors = _texts(), {}, {}
    for precision in ("fp32", "bf16", "fp16"):
        model = _embed_model(precision)
        runner = ready_runner(model, "cuda", 64, graph=RuntimeConfig().torch_graph)
        seqs = _sequences(model, texts)
        result, rate = _rate(lambda r=runner, s=seqs: r.run(s), len(seqs))
        vectors[precision] = result.values
        figures[f"{precision}_sentences_per_s"] = round(rate, 1)
        del runner
    for precision in ("bf16", "fp16"):
        figures[f"{precision}_min_cosine_vs_fp32"] = round(
            _min_cosine(vectors[precision], vectors["fp32"]), 5
        )
    ok = all(figures[f"{p}_min_cosine_vs_fp32"] >= MIN_COSINE for p in ("bf16", "fp16"))
    return ok, figures


def check_embed_limit(precision: str = "bf16") -> tuple[bool, dict[str, Any]]:
    """The bare model in process (mean pooling, no service code) at its best batch, and the runner."""
    import numpy as np
    import torch
    from transformers import AutoModel

    from deployments.config import RuntimeConfig
    from deployments.runtime.backends import ready_runner
    from deployments.runtime.torch_runner import DTYPES
    from preprocess.tokenize import pad_token_id

    model = _embed_model(precision)
    seqs = sorted(_sequences(model, _texts()), key=len)
    pad = pad_token_id(model.tokenizer_file)
    bare = AutoModel.from_pretrained(str(model.weights_dir), dtype=DTYPES[precision]).cuda().eval()

    @torch.inference_mode()
    def bare_pass(batch: int) -> None:
        for start in range(0, len(seqs), batch):
            chunk = seqs[start : start + batch]
            ids = np.full((len(chunk), max(map(len, chunk))), pad, dtype=np.int64)
            for row, s in enumerate(chunk):
                ids[row, : len(s)] = s
            ids_t = torch.from_numpy(ids).cuda(non_blocking=True)
            mask = (ids_t != pad).to(bare.dtype)
            hidden = bare(input_ids=ids_t, attention_mask=mask.long()).last_hidden_state
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            torch.nn.functional.normalize(pooled.float(), dim=-1).cpu()

    limits = {b: _rate(lambda b=b: bare_pass(b), len(seqs))[1] for b in (64, 256, 1024)}
    best_batch = max(limits, key=limits.__getitem__)
    runner = ready_runner(model, "cuda", 64, graph=RuntimeConfig().torch_graph)
    _, service = _rate(lambda: runner.run(seqs), len(seqs))
    ratio = service / limits[best_batch]
    figures = {
        "precision": precision,
        "in_process_limit_sentences_per_s": round(limits[best_batch], 1),
        "limit_batch": best_batch,
        "service_runner_sentences_per_s": round(service, 1),
        "ratio": round(ratio, 3),
        "bound": f"ratio >= {MIN_LIMIT_RATIO}",
    }
    return ratio >= MIN_LIMIT_RATIO, figures


def _generate(lm: Any, prompts: list[list[int]], sampling: list[Any], max_new: int) -> dict[str, Any]:
    """Each prompt through the service's engine on ``lm``'s device: request id -> token ids (or error)."""
    import threading

    from deployments.config import GenerationConfig
    from deployments.runtime.generate.engine import Engine

    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    errors: dict[str, str] = {}
    done = threading.Semaphore(0)

    def sink(event: Any) -> None:
        if event.token_id is not None:
            tokens[event.request_id].append(event.token_id)
        if event.finish is not None:
            if event.finish == "error":
                errors[event.request_id] = event.error or "error"
            done.release()

    engine = Engine(lm, (), GenerationConfig())
    engine.start()
    try:
        for i, prompt in enumerate(prompts):
            engine.submit(str(i), prompt, max_new, sampling[i], sink)
        for _ in prompts:
            if not done.acquire(timeout=120):
                raise TimeoutError("the engine did not finish every request in 120 s")
    finally:
        engine.stop()
    return {"tokens": tokens, "errors": errors}


def check_generate_parity(prompts_n: int = 6, max_new: int = 32) -> tuple[bool, dict[str, Any]]:
    import random

    from deployments.config import ModelConfig
    from deployments.repository.resolve import resolve_model
    from deployments.runtime.generate.load import load_causal_lm
    from deployments.runtime.generate.sampling import Sampling

    model = resolve_model(
        ModelConfig(name=GENERATE_MODEL, task="generate", precision="fp32"), hash_files=False
    )
    cpu, gpu = load_causal_lm(model, "cpu"), load_causal_lm(model, "cuda")
    rng = random.Random(5)
    vocab = cpu.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(rng.randrange(4, 40))] for _ in range(prompts_n)]
    greedy = [Sampling()] * prompts_n
    on_cpu, on_gpu = _generate(cpu, prompts, greedy, max_new), _generate(gpu, prompts, greedy, max_new)
    same = sum(on_cpu["tokens"][k] == on_gpu["tokens"][k] for k in on_cpu["tokens"])
    sampled = [Sampling(0.8, 0.9, seed=100 + i) for i in range(prompts_n)]
    first, second = _generate(gpu, prompts, sampled, max_new), _generate(gpu, prompts, sampled, max_new)
    figures = {
        "greedy_equal_prompts": f"{same}/{prompts_n}",
        "sampled_errors": len(first["errors"]) + len(second["errors"]),
        "sampled_repeat": first["tokens"] == second["tokens"],
        "sampled_tokens": sum(map(len, first["tokens"].values())),
    }
    ok = same == prompts_n and not on_cpu["errors"] and not on_gpu["errors"]
    ok = ok and figures["sampled_errors"] == 0 and figures["sampled_repeat"]
    return ok and figures["sampled_tokens"] == prompts_n * max_new, figures


def run_checks(checks: dict[str, Check]) -> bool:
    passed = True
    for name, check in checks.items():
        t0 = time.perf_counter()
        try:
            ok, figures = check()
        except Exception as exc:  # one check failing must not hide the others
            traceback.print_exc()
            ok, figures = False, {"error": f"{type(exc).__name__}: {exc}"}
        seconds = time.perf_counter() - t0
        shown = "  ".join(f"{k}={v}" for k, v in figures.items())
        print(f"{'PASS' if ok else 'FAIL'}  {name} ({seconds:.0f} s)  {shown}", flush=True)
        passed = passed and ok
    return passed


def main(argv: list[str] | None = None) -> int:
    from bench.gpu_check_service import check_oom_split, check_priority

    all_checks: dict[str, Check] = {
        "embed-precisions": check_embed_precisions,
        "embed-limit": check_embed_limit,
        "generate-parity": check_generate_parity,
        "oom-split-retry": check_oom_split,
        "priority-under-bulk": check_priority,
    }
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(all_checks), help="run these checks only")
    ns = parser.parse_args(argv)
    from deployments.config import RuntimeConfig
    from deployments.runtime.cuda_memory import apply_alloc_conf

    apply_alloc_conf(RuntimeConfig().cuda_alloc_conf)  # as a replica does, before CUDA initializes
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 2
    print(f"gpu_check on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    chosen = {k: v for k, v in all_checks.items() if not ns.only or k in ns.only}
    passed = run_checks(chosen)
    print("ALL PASS" if passed else "SOME CHECKS FAILED", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
