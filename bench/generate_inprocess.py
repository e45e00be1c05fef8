"""The design's rows, in process (no HTTP): the bench model in the run's precision, greedy, 100 new
tokens from a short prompt, with plain transformers (the service's own engine is measured over HTTP).

- ``no-cache``: ``model.generate(use_cache=False)`` (every step recomputes the whole sequence);
- ``cache``: ``model.generate()`` with its KV cache;
- ``batched-4``: 4 copies of the prompt in one ``model.generate()`` call (a static batch, with the cache).

End of sequence is switched off (``min_new_tokens``), so every request makes exactly ``new_tokens`` tokens.
The design's own figures (``DESIGN`` in ``bench.generate_stats``) are for a 7B model on a GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.generate_stats import DESIGN, DesignRow
from bench.machine import OtherLoadProbe

PROMPT = "The quick brown fox jumps over"
T = TypeVar("T")


def on_passing_thread(fn: Callable[[], T], name: str = "bench-torch") -> T:
    """``fn()`` on a new thread, ended when this returns, so that the OpenMP pool torch makes on it ends too
    (a thread of this process that lives on with a pool slows every other thread's torch). Returns ``fn``'s
    result, or raises its exception here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def load(model_dir: Path, precision: str = "fp32") -> tuple[Any, Any]:
    from bench.naive_generate_server import load as load_model

    return load_model(model_dir, precision)


def _generate(model: Any, ids: Any, new_tokens: int, use_cache: bool) -> float:
    """Seconds of ``model.generate`` on ``ids`` (a row per request), greedy, exactly ``new_tokens`` each."""
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


def design_rows(
    model_dir: Path, new_tokens: int = 100, batch: int = 4, log: Any = print, precision: str = "fp32"
) -> list[DesignRow]:
    import torch

    # Every torch call on a thread that ends (on_passing_thread).
    tokenizer, model = on_passing_thread(lambda: load(model_dir, precision))
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    batched = ids.repeat(batch, 1)  # the same prompt: no padding
    on_passing_thread(lambda: _generate(model, batched, 8, True))  # warm-up
    where = f"{ids.shape[1]}-token prompt, torch on a worker thread ({torch.get_num_threads()} intra-op)"
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
            f"batched-{batch}",
            f"{batch} prompts in one model.generate() call (static batch, KV cache), {where}",
            lambda: _generate(model, batched, new_tokens, True),
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
    benchmark's own process, the rows left every system measured after them slower, for reasons this
    process's state holds (the model, its allocations, threads); a process that ends holds nothing."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        rows: list[DesignRow] = pool.apply(design_rows, (model_dir, new_tokens), {"precision": precision})
    return rows
