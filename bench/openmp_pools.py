"""What a second OpenMP pool costs a model thread, measured (deployments/runtime/openmp.py says why).

    .venv/bin/python -m bench.openmp_pools --model-dir .bench/models/gpt2-small/1

One decode step of the generation engine (the bench model, packed weights and row groups, as the service
runs it) over 8 and 32 rows of 30-420 cached tokens, its median over 40 steps, and how busy the two busiest
threads of the process were meanwhile. Three ways of placing the work, each in a fresh process (libgomp's
pools live as long as their threads), taking turns, twice:

- ``one thread``: the model set up and run on the same thread;
- ``set up on a live thread``: set up on the main thread, which stays alive, and run on another (the engine's
  thread), as the service did before ``on_passing_thread``: two pools;
- ``set up on a passing thread``: set up on a thread that ends, then run on another (the service now).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

VARIANTS = ("one thread", "set up on a live thread", "set up on a passing thread")
STEPS = 40


def _thread_ticks() -> dict[str, int]:
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks[tid] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def _child(model_dir: Path, variant: str, rows: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from bench.engine_kernels import _batch
    from deployments.runtime.generate.packed import pack_linears
    from deployments.runtime.generate.passes import decode_step
    from deployments.runtime.generate.row_attention import use_row_groups
    from deployments.runtime.openmp import on_passing_thread

    def setup() -> tuple[torch.nn.Module, object]:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        model = model.eval()
        pack_linears(model)
        use_row_groups(model)
        with torch.inference_mode():
            return model, _batch(model, rows)

    result: dict[str, float] = {}

    def run() -> None:
        ids = torch.randint(1, 1000, (rows, 1))
        with torch.inference_mode():
            for _ in range(3):
                decode_step(model, batch, ids)
            before, start, times = _thread_ticks(), time.perf_counter(), []
            for _ in range(STEPS):
                t0 = time.perf_counter()
                decode_step(model, batch, ids)
                times.append(time.perf_counter() - t0)
            wall, after = time.perf_counter() - start, _thread_ticks()
        hz = os.sysconf("SC_CLK_TCK")
        busy = sorted(((after[t] - before.get(t, 0)) / hz / wall for t in after), reverse=True)
        result.update(ms=1000 * sorted(times)[STEPS // 2], busy1=busy[0], busy2=busy[1])

    if variant == "one thread":
        model, batch = setup()
        run()
    else:
        model, batch = setup() if variant == "set up on a live thread" else on_passing_thread(setup)
        worker = threading.Thread(target=run, name="generate")
        worker.start()
        worker.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "ROWS"), help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        print(json.dumps(_child(ns.model_dir, ns.child[0], int(ns.child[1]))))
        return
    print(f"decode step, median of {STEPS}; busy: the two busiest threads' CPU share over the steps")
    print("| rows | placement | ms (each round) | busy (each round) |\n|---|---|---|---|")
    for rows in (8, 32):
        seen: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for _ in range(ns.rounds):
            for variant in VARIANTS:
                cmd = [sys.executable, "-m", "bench.openmp_pools", "--model-dir", str(ns.model_dir)]
                out = subprocess.run(
                    [*cmd, "--child", variant, str(rows)], capture_output=True, text=True, check=True
                )
                seen[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for variant, runs in seen.items():
            ms = ", ".join(f"{r['ms']:.1f}" for r in runs)
            busy = ", ".join(f"{r['busy1']:.0%}/{r['busy2']:.0%}" for r in runs)
            print(f"| {rows} | {variant} | {ms} | {busy} |", flush=True)


if __name__ == "__main__":
    main()
