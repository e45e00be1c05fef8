"""What an idle gap before a single text's forward pass costs, by threads and backend (in process, no Ray).

    .venv/bin/python -m bench.idle_pass --model-dir models/all-MiniLM-L6-v2/1 --pauses 5,20,50,100
    GOMP_SPINCOUNT=1000000 .venv/bin/python -m bench.idle_pass ...      # libgomp's workers spinning longer
    .venv/bin/python -m bench.idle_pass ... --onnx-file infinity=.bench/infinity-model/model.onnx
    GOMP_SPINCOUNT=10000 .venv/bin/python -m bench.idle_pass --pauses 5,50 --texts 20 --lengths 12,64,128,158

Light open-loop traffic (10 req/s) leaves the machine idle ~100 ms between requests; one client sending texts
one after another leaves it idle a few ms. This measures a pass of one corpus text after each pause, on one
model thread (set up on a thread that ends, as the replicas do: runtime/openmp.py), one variant after
the other: the service's copy (torch, the configured precision, traced, one intra-op thread), the same on two
threads, and ONNX Runtime on the model's export (one thread; two threads with and without its spinning, and
spinning only within a run: ``session.force_spinning_stop``), and the service's lone passes where the machine
allows one (two threads pinned to two CPUs: ONNX Runtime, deployments/runtime/lone_pass.py, and the copy's
torch graph, deployments/runtime/lone_torch.py). ``--lengths``: one table column per text length. It
answers whether a second thread helps a lone pass at the gaps real traffic leaves (docs/architecture.md,
"a third time").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Pass = Callable[[np.ndarray, np.ndarray], Any]
WARM_UP = 5  # inputs run through every variant before the timed passes


def parse_pauses(text: str) -> list[float]:
    """``"5,20,100"`` (milliseconds) -> seconds."""
    pauses = [float(p) / 1000 for p in text.split(",") if p.strip()]
    if not pauses or any(p < 0 for p in pauses):
        raise argparse.ArgumentTypeError(f"expected milliseconds like 5,20,100, got {text!r}")
    return pauses


def summary_ms(seconds: list[float]) -> tuple[float, float]:
    """(p50, mean) in milliseconds."""
    return 1000 * statistics.median(seconds), 1000 * statistics.fmean(seconds)


def render(measured: Measured) -> str:
    lines = [
        "| pause before each pass | variant | p50 ms | mean ms | CPU ms per pass |",
        "|---|---|---|---|---|",
    ]
    for pause, by_variant in measured.seconds.items():
        for label, seconds in by_variant.items():
            p50, mean = summary_ms(seconds)
            cpu = 1000 * measured.cpu_per_pass.get((pause, label), float("nan"))
            lines.append(f"| {1000 * pause:g} ms | {label} | {p50:.2f} | {mean:.2f} | {cpu:.1f} |")
    return "\n".join(lines)


def _torch_pass(runner: Any, threads: int) -> Pass:
    import torch

    def run(ids: np.ndarray, mask: np.ndarray) -> Any:
        torch.set_num_threads(threads)  # this thread's count: one model thread, one OpenMP pool
        return runner._forward(ids, mask)

    return run


def _onnx_pass(path: Path, threads: int, spinning: bool, stop_after_run: bool = False) -> Pass:
    import onnxruntime as ort

    from deployments.runtime.onnx_runner import session_options  # the service's own settings

    opts = session_options(threads, spinning, stop_spinning_after_run=stop_after_run)
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def run(ids: np.ndarray, mask: np.ndarray) -> Any:
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in names:  # exports that keep BERT's segment input
            feed["token_type_ids"] = np.zeros_like(ids)
        return session.run(None, {k: v for k, v in feed.items() if k in names})

    return run


def _lone_pass(export_dir: Path) -> tuple[str, Pass] | None:
    """The service's lone pass (deployments/runtime/lone_pass.py) on the export, where this machine allows it:
    its calls go through its own pinned thread, as in the pipeline replica."""
    import os

    from bench.inprocess import load_model_dir
    from deployments.runtime.lone_pass import LonePass, placement
    from preprocess.tokenize import pad_token_id

    where = placement(os.sched_getaffinity(0))
    if where is None:
        return None
    export = load_model_dir(export_dir, "fp32")
    lone = LonePass(export, pad_token_id(export.tokenizer_file), where)

    def run(ids: np.ndarray, mask: np.ndarray) -> Any:
        return lone.executor.submit(lone.runner._forward, ids, mask).result()

    label = (
        f"onnx fp32, the lone pass: 2 threads pinned (caller CPU {where.caller_cpu}, worker CPU "
        f"{where.worker_cpu}), spinning within a run only"
    )
    return label, run


def _torch_lone_pass(runner: Any, precision: str) -> tuple[str, Pass] | None:
    """The lone pass on the copy's torch graph (deployments/runtime/lone_torch.py): two OpenMP threads, the
    calling thread and libgomp's worker pinned to one CPU each. Set ``GOMP_SPINCOUNT`` as the service does."""
    import os

    from deployments.runtime.lone_pass import placement
    from deployments.runtime.lone_torch import pinned_forward, spin_count

    where = placement(os.sched_getaffinity(0))
    if where is None:
        return None
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lone-torch")
    executor.submit(os.sched_setaffinity, 0, {where.caller_cpu}).result()
    shared = pinned_forward(runner, executor, where.worker_cpu)
    if shared is None:
        return None

    def run(ids: np.ndarray, mask: np.ndarray) -> Any:
        return executor.submit(shared._forward, ids, mask).result()

    return f"torch {precision}, the lone pass on torch: 2 threads pinned, GOMP_SPINCOUNT {spin_count()}", run


def variants(model_dir: Path, precision: str, onnx_files: dict[str, Path]) -> dict[str, Pass]:
    from bench.inprocess import load_model_dir, make_runner

    model = load_model_dir(model_dir, precision)
    runner = make_runner(model, "cpu", threads=1, graph="trace")
    found: dict[str, Pass] = {
        f"torch {precision}, 1 thread (the pipeline's copy)": _torch_pass(runner, 1),
        f"torch {precision}, 2 threads": _torch_pass(runner, 2),
    }
    own = model_dir / "onnx" / "model.onnx"
    files = ({"onnx fp32": own} if own.exists() else {}) | onnx_files
    for label, path in files.items():
        found[f"{label}, 1 thread"] = _onnx_pass(path, 1, spinning=False)
        found[f"{label}, 2 threads"] = _onnx_pass(path, 2, spinning=False)
        found[f"{label}, 2 threads, spinning"] = _onnx_pass(path, 2, spinning=True)
        found[f"{label}, 2 threads, spinning within a run only"] = _onnx_pass(
            path, 2, spinning=True, stop_after_run=True
        )
    lone = _lone_pass(own.parent) if own.exists() else None
    if lone is not None:
        found[lone[0]] = lone[1]
    lone_torch = _torch_lone_pass(runner, precision)
    if lone_torch is not None:
        found[lone_torch[0]] = lone_torch[1]
    return found


@dataclass(frozen=True)
class Measured:
    """Pass times (seconds) by pause and variant, and the process's CPU seconds per pass over each variant's
    block, pauses included: what spinning workers burn between passes shows there."""

    seconds: dict[float, dict[str, list[float]]]
    cpu_per_pass: dict[tuple[float, str], float]


def measure(
    passes: dict[str, Pass], inputs: list[tuple[np.ndarray, np.ndarray]], pauses: list[float]
) -> Measured:
    """Every input through each variant, a pause before each pass; all on one model thread."""
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")

    def timed(fn: Pass, ids: np.ndarray, mask: np.ndarray) -> float:
        start = time.perf_counter()
        fn(ids, mask)
        return time.perf_counter() - start

    for ids, mask in inputs[:WARM_UP]:  # first passes pay lazy init (OpenMP pools, ORT arenas): not timed
        for fn in passes.values():
            thread.submit(fn, ids, mask).result()
    results: dict[float, dict[str, list[float]]] = {}
    cpu: dict[tuple[float, str], float] = {}
    for pause in pauses:
        seen: dict[str, list[float]] = {}
        for label, fn in passes.items():  # one variant at a time: its passes follow its own, as in a server
            time.sleep(0.5)  # ONNX Runtime's spinning workers from the variant before are asleep again
            seen[label] = []
            cpu_before = time.process_time()
            for ids, mask in inputs:
                time.sleep(pause)
                seen[label].append(thread.submit(timed, fn, ids, mask).result())
            cpu[pause, label] = (time.process_time() - cpu_before) / len(inputs)
        results[pause] = seen
    thread.shutdown()
    return Measured(results, cpu)


def nearest_lengths(
    inputs: list[tuple[np.ndarray, np.ndarray]], lengths: list[int], reps: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each wanted token count, the input nearest to it, ``reps`` times in a row."""
    chosen = [min(inputs, key=lambda pair: abs(pair[0].shape[1] - want)) for want in lengths]
    return [pair for pair in chosen for _ in range(reps)]


def render_by_length(measured: Measured, inputs: list[tuple[np.ndarray, np.ndarray]], reps: int) -> str:
    """p50 ms of each block of ``reps`` passes (one text each), by pause and variant."""
    lengths = [ids.shape[1] for ids, _ in inputs[::reps]]
    lines = [
        "| pause | variant | " + " | ".join(f"{n} tokens" for n in lengths) + " | CPU ms per pass |",
        "|---|---|" + "---|" * (len(lengths) + 1),
    ]
    for pause, by_variant in measured.seconds.items():
        for label, seconds in by_variant.items():
            cells = [
                f"{1000 * statistics.median(seconds[i : i + reps]):.1f}" for i in range(0, len(seconds), reps)
            ]
            cpu = 1000 * measured.cpu_per_pass.get((pause, label), float("nan"))
            lines.append(f"| {1000 * pause:g} ms | {label} | " + " | ".join(cells) + f" | {cpu:.1f} |")
    return "\n".join(lines)


def corpus_inputs(model_dir: Path, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from bench.corpus import build_corpus
    from bench.inprocess import load_model_dir
    from preprocess.tokenize import TextTokenizer

    model = load_model_dir(model_dir)
    tok = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    inputs = []
    for text in build_corpus(limit=count).texts[:count]:
        ids = tok.encode([text], truncate=True).ids.astype(np.int64)[None, :]
        inputs.append((ids, np.ones_like(ids)))
    return inputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=Path("models/all-MiniLM-L6-v2/1"))
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--pauses", type=parse_pauses, default=parse_pauses("5,20,50,100"))
    parser.add_argument("--texts", type=int, default=100, help="corpus texts, one pass each per variant")
    parser.add_argument("--onnx-file", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument(
        "--lengths",
        help="token counts like 12,64,128,158: the corpus text nearest each, --texts passes each, by length",
    )
    ns = parser.parse_args(argv)
    extra = {label: Path(path) for label, _, path in (s.partition("=") for s in ns.onnx_file)}
    from deployments.runtime.openmp import on_passing_thread

    passes = on_passing_thread(lambda: variants(ns.model_dir, ns.precision, extra))
    if ns.lengths:
        wanted = [int(n) for n in ns.lengths.split(",")]
        inputs = nearest_lengths(corpus_inputs(ns.model_dir, 600), wanted, ns.texts)
        print(render_by_length(measure(passes, inputs, ns.pauses), inputs, ns.texts))
        return 0
    print(render(measure(passes, corpus_inputs(ns.model_dir, ns.texts), ns.pauses)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
