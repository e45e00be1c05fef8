"""The design's rows, in process (no HTTP): the bench model in the run's precision, greedy, 100 new
tokens from a short prompt.

- ``no-cache``: ``model.generate(use_cache=False)`` (every step recomputes the whole sequence);
- ``cache``: ``model.generate()`` with its KV cache;
- ``engine-1``: one request through the project's engine (``deployments.runtime.generate.engine``);
- ``batched-4``: 4 requests submitted together to the engine (continuous batching), until all 4 end.

End of sequence is switched off (``min_new_tokens``; the engine gets no eos ids), so every request makes
exactly ``new_tokens`` tokens. The design's own figures (a 7B model on a GPU, 4 x 100 tokens): 8 s
without the cache, 2 s with it, 3 s for 4 batched requests.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bench.generate_stats import DESIGN, DesignRow
from bench.machine import OtherLoadProbe
from deployments.runtime.openmp import on_passing_thread

PROMPT = "The quick brown fox jumps over"


def load(model_dir: Path, precision: str = "fp32") -> tuple[Any, Any]:
    from bench.naive_generate_server import load as load_model

    return load_model(model_dir, precision)


def _generate(model: Any, ids: Any, new_tokens: int, use_cache: bool) -> float:
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=use_cache,
            pad_token_id=model.generation_config.pad_token_id,
        )
    seconds = time.perf_counter() - t0
    made = out.shape[1] - ids.shape[1]
    if made != new_tokens:
        raise RuntimeError(f"model.generate made {made} tokens, not {new_tokens}")
    return seconds


def _engine(model: Any, prompt: list[int], requests: int, new_tokens: int) -> float:
    from deployments.runtime.generate.engine import Engine, EngineLimits, TokenEvent
    from deployments.runtime.generate.sampling import Sampling

    engine = Engine(model, (), EngineLimits(max_running=max(4, requests)))
    counts = dict.fromkeys(range(requests), 0)
    finished = threading.Event()
    done: set[str] = set()
    problems: list[str] = []
    lock = threading.Lock()

    def sink(event: TokenEvent) -> None:
        with lock:
            if event.token_id is not None:
                counts[int(event.request_id)] += 1
            if event.finish is not None:
                if event.finish != "length":
                    problems.append(f"{event.request_id}: {event.finish} {event.error or ''}")
                done.add(event.request_id)
                if len(done) == requests:
                    finished.set()

    engine.start()
    try:
        t0 = time.perf_counter()
        for i in range(requests):
            engine.submit(str(i), prompt, new_tokens, Sampling(), sink)
        if not finished.wait(timeout=1800):
            raise RuntimeError("the engine did not finish within 30 minutes")
        seconds = time.perf_counter() - t0
    finally:
        engine.stop()
    if problems or any(n != new_tokens for n in counts.values()):
        raise RuntimeError(f"engine: {problems or counts}")
    return seconds


def design_rows(
    model_dir: Path, new_tokens: int = 100, batch: int = 4, log: Any = print, precision: str = "fp32"
) -> list[DesignRow]:
    import copy

    import torch

    from deployments.runtime.generate.packed import pack_linears

    def setup() -> tuple[Any, Any, Any, int]:
        tokenizer, model = load(model_dir, precision)
        # The engine's rows run the model as the service's engine does (generation.packed_weights, on).
        engine_model = copy.deepcopy(model)
        return tokenizer, model, engine_model, pack_linears(engine_model)

    # Every torch call on a thread that ends, as the service does (deployments/runtime/openmp.py): a
    # thread of this process that lives on with an OpenMP pool would slow every other thread's torch.
    tokenizer, model, engine_model, swapped = on_passing_thread(setup)
    packed = " on oneDNN packed weights" if swapped else ""
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    prompt = ids[0].tolist()
    on_passing_thread(lambda: _generate(model, ids, 8, True))  # warm-up
    _engine(engine_model, prompt, 1, 8)
    where = f"{len(prompt)}-token prompt, torch on a worker thread ({torch.get_num_threads()} intra-op)"
    rows = []
    for name, what, run, design in (
        (
            "no-cache",
            f"model.generate(use_cache=False), {where}",
            lambda: _generate(model, ids, new_tokens, False),
            DESIGN["no_cache_s"],
        ),
        (
            "cache",
            f"model.generate() with its KV cache, {where}",
            lambda: _generate(model, ids, new_tokens, True),
            DESIGN["cache_s"],
        ),
        (
            "engine-1",
            f"1 request through the engine (deployments.runtime.generate.engine){packed}",
            lambda: _engine(engine_model, prompt, 1, new_tokens),
            None,
        ),
        (
            f"batched-{batch}",
            f"{batch} requests submitted together to the engine (continuous batching){packed}",
            lambda: _engine(engine_model, prompt, batch, new_tokens),
            DESIGN["batched_s"] if batch == 4 else None,
        ),
    ):
        probe = OtherLoadProbe(None)  # anything but this process and its children
        probe.start()
        seconds = on_passing_thread(run)
        other = probe.stop()
        requests = batch if name.startswith("batched") else 1
        other = None if other is None else round(other, 3)
        rows.append(DesignRow(name, what, round(seconds, 3), requests, new_tokens, design, other))
        busy = "" if other is None else f", other load {other * 100:.0f} %"
        log(f"  {name:10s} {seconds:7.2f} s  ({requests} x {new_tokens} tokens{busy})")
    return rows


def design_rows_apart(model_dir: Path, new_tokens: int = 100, precision: str = "fp32") -> list[DesignRow]:
    """``design_rows`` in a child process of its own, which ends before the HTTP systems start: run in the
    benchmark's own process, the rows left every system measured after them slower (the service's output
    tokens/s at 1 and 8 clients 0.8-0.9x that of a run without them), for reasons this process's state
    holds (two models, their allocations, threads); a process that ends holds nothing."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        rows: list[DesignRow] = pool.apply(design_rows, (model_dir, new_tokens), {"precision": precision})
    return rows
