"""At light load the pipeline's CPU copy runs each group on both cores, its two threads pinned.

The copy runs each group on one intra-op thread, so that two groups at once use both cores. But at light
load (one client, or an open-loop rate up to a few tens of requests a second) a group usually runs alone
and leaves the other core idle: a long text's single-thread pass is most of the gap to Infinity's ONNX
engine (docs/architecture.md, "A lone pass on both cores"). A second thread helps only where it wakes on
the other core. Measured in-process on 2 vCPUs (``bench/idle_pass.py``): unpinned, a worker woken after an
idle gap landed beside the caller and two threads lost to one; with the caller pinned to one CPU and ONNX
Runtime's worker to the other, spinning within a run only, a lone pass of a corpus text took 5.0 ms p50
after 100 ms idle against 7.7 ms on one torch thread, at 10.6 ms of CPU against 8.7 (Infinity's default,
spinning on after each run, burns 46 ms of CPU per pass there, which the other replicas need).

Only where it was measured: a replica allowed exactly two CPUs (os.sched_getaffinity), a model with an fp32
ONNX export in ``<version>/onnx/`` whose manifest and outputs agree with the copy's. Anywhere else the copy
runs as before and the log says why. The lengths at which the copy's own torch graph on the same two pinned
threads was faster at load run on it instead (runtime/lone_torch.py: on a CPU with AMX, long texts in about
half the time). No Ray.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from deployments.repository.manifest import (
    ManifestError,
    ResolvedModel,
    load_manifest,
    read_json,
    weights_dir_of,
)
from deployments.repository.weights_check import check_weights
from deployments.runtime.lone_torch import torch_lone_pass
from deployments.runtime.onnx_runner import OnnxRunner, session_options
from deployments.runtime.openmp import on_passing_thread
from deployments.runtime.runner_base import BatchRunner
from deployments.runtime.torch_graph import CHECK_SHAPES, check_batch, compare_outputs

log = logging.getLogger("textserve.runner")

EXPORT_SUBDIR = "onnx"  # the fp32 export (deployments.runtime.export_onnx's default output)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a lone pass runs: the thread that calls ONNX Runtime on one CPU, its worker on the other."""

    caller_cpu: int
    worker_cpu: int


def placement(allowed: set[int]) -> Placement | None:
    """Two allowed CPUs: one each. Otherwise None: with more, other replicas' pinned threads could share
    a CPU (unmeasured); with one, there is no second core to use."""
    if len(allowed) != 2:
        return None
    first, second = sorted(allowed)
    return Placement(first, second)


def load_export(served: ResolvedModel, hash_files: bool) -> ResolvedModel:
    """The served version's fp32 ONNX export, checked against it; ``ManifestError`` names the field at
    fault, or ``FileNotFoundError`` when there is no export."""
    path = served.manifest_path.parent / EXPORT_SUBDIR / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(path)
    manifest = load_manifest(path)
    for field in ("name", "version", "task"):
        want, have = getattr(served.manifest, field), getattr(manifest, field)
        if want != have:
            raise ManifestError(field, f"the served model says {want!r} but its export {have!r}", path)
    if manifest.format != "onnx" or manifest.precision != "fp32":
        raise ManifestError(
            "format", f"not an fp32 ONNX export ({manifest.format}, {manifest.precision})", path
        )
    weights = weights_dir_of(manifest, path)
    export = ResolvedModel(manifest, path, weights, "fp32")
    check_weights(manifest, weights, path, hash_files)
    # The pass takes the copy's token ids and must give the copy's answers: the same tokenizer and shape.
    if export.tokenizer_id != served.tokenizer_id:
        raise ManifestError("input.tokenizer", "the export's tokenizer differs from the served model's", path)
    if (
        export.output_size != served.output_size
        or manifest.input.max_tokens != served.manifest.input.max_tokens
    ):
        raise ManifestError(
            "output", "the export's input or output shape differs from the served model's", path
        )
    return export


def check_agrees(served: BatchRunner, lone: BatchRunner, vocab: int) -> None:
    """Both runners' outputs on padded, unpadded, one-row and one-token batches, within the backend parity
    bar (torch_graph.compare_outputs); raises ``RuntimeError`` naming the shape otherwise."""
    for shape in CHECK_SHAPES:
        ids, mask = check_batch(*shape, vocab, torch.device("cpu"))
        sequences = [row[: int(n)] for row, n in zip(ids.numpy(), mask.sum(dim=1).numpy(), strict=True)]
        want, got = served.run(sequences).values, lone.run(sequences).values
        compare_outputs(served.task, shape, torch.from_numpy(want), torch.from_numpy(got), "the ONNX export")


@dataclass(slots=True)
class Overlaps:
    """Which runner a group takes, from the share of recent groups that arrived while another ran in the
    copy (an exponentially weighted average over arrivals). While that share is at most ``max_overlap``,
    groups run on the lone pass one after another: a group that forms during a lone pass waits for it
    (~5 ms) on its thread. Run beside it on the one-thread copy instead, three threads share the two cores
    and both groups slow down: in one run, two rounds, open-loop p50 at 20-60 req/s 12.6-14.9 ms waiting
    against 14.4-19.6 beside (docs/architecture.md). Above the share, as under closed-loop load (8 clients
    nearly always overlap), groups run beside each other on one thread each, which uses both cores
    without a wait; a lone pass then never starts beside a group on the copy."""

    max_overlap: float = 1.0
    weight: float = 1 / 16
    share: float = 0.0

    def takes(self, running: int, beside: int) -> bool:
        """Whether a group that arrives with ``running`` groups in the copy, ``beside`` of them on the
        one-thread copy, runs on the lone pass (queued behind any lone passes running)."""
        self.share += self.weight * (float(running > 0) - self.share)
        return beside == 0 and self.share <= self.max_overlap


class LonePass:
    """The export on two intra-op threads, ``where`` pinned, run from its own (pinned) thread; ``overlaps``
    says whether a group runs on it."""

    def __init__(
        self, export: ResolvedModel, pad_id: int, where: Placement, max_overlap: float = 1.0
    ) -> None:
        opts = session_options(2, spinning=True, stop_spinning_after_run=True)
        # 1-based logical processor ids, one per worker thread besides the caller's.
        opts.add_session_config_entry("session.intra_op_thread_affinities", str(where.worker_cpu + 1))
        self.runner = OnnxRunner(export, "cpu", pad_id, options=opts)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lone-pass")
        # pid 0: the calling thread only, here the executor's one thread
        self.executor.submit(os.sched_setaffinity, 0, {where.caller_cpu}).result()
        self.where = where
        self.overlaps = Overlaps(max_overlap)
        # The copy's torch graph on this thread, for groups of at least ``torch_from`` tokens
        # (runtime/lone_torch.py): measured at load, None where ONNX Runtime was as fast at every length.
        self.torch: BatchRunner | None = None
        self.torch_from = 0

    def runner_for(self, longest: int) -> BatchRunner:
        """The lone pass's runner for a group whose longest text has ``longest`` tokens."""
        if self.torch is not None and longest >= self.torch_from:
            return self.torch
        return self.runner

    @classmethod
    def for_copy(
        cls,
        served: ResolvedModel,
        copy: BatchRunner,
        hash_files: bool,
        max_overlap: float = 1.0,
        allowed: set[int] | None = None,
        copy_threads: int | None = 1,
        torch_lengths: bool = True,
    ) -> LonePass | None:
        """The copy's lone pass, or None (logged) where it was not measured or does not check out.
        ``torch_lengths``: also measure the copy's torch graph on the lone pass's threads and run the lengths
        where it was faster on it; ``copy_threads``: the copy's intra-op threads."""
        cpus = os.sched_getaffinity(0) if allowed is None else allowed
        where = placement(cpus)
        if where is None:
            log.info("lone passes on one thread: the replica may use %d CPUs, not 2", len(cpus))
            return None
        try:
            lone = cls(load_export(served, hash_files), copy.pad_id, where, max_overlap)
        except FileNotFoundError as exc:
            log.info("lone passes on one thread: no fp32 ONNX export (%s)", exc)
            return None
        except ManifestError as exc:
            log.error("lone passes on one thread: the ONNX export does not check out: %s", exc)
            return None
        vocab = _vocab_size(served.weights_dir)
        try:
            # On a thread that ends: the copy's torch passes leave no OpenMP pool here (runtime/openmp.py).
            on_passing_thread(lambda: check_agrees(copy, lone.runner, vocab), name="lone-pass-check")
        except RuntimeError as exc:
            log.error("lone passes on one thread: the ONNX export's outputs differ from the copy's: %s", exc)
            lone.executor.shutdown()
            return None
        max_tokens = served.manifest.input.max_tokens
        lone.executor.submit(lone.runner.warm_up, max_tokens, 2).result()
        if torch_lengths:
            chosen = torch_lone_pass(
                copy, copy_threads, lone.runner, lone.executor, where.worker_cpu, max_tokens
            )
            if chosen is not None:
                lone.torch, lone.torch_from = chosen
        log.info(
            "lone passes: ONNX Runtime, caller on CPU %d, worker on CPU %d",
            where.caller_cpu,
            where.worker_cpu,
        )
        return lone


def _vocab_size(weights: Path) -> int:
    return int(read_json(weights / "config.json").get("vocab_size", 1000))


__all__ = ["LonePass", "Overlaps", "Placement", "check_agrees", "load_export", "placement"]
