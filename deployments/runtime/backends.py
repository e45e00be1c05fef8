"""Pick the runner for a model: the torch or the ONNX Runtime backend, by the manifest's format."""

from __future__ import annotations

from deployments.repository.manifest import ResolvedModel
from deployments.runtime.runner_base import BatchRunner
from preprocess.tokenize import pad_token_id


def create_runner(
    model: ResolvedModel,
    device: str = "auto",
    pad_id: int | None = None,
    threads: int | None = None,
    cache_release_fraction: float = 0.9,
    parallel_passes: int = 1,
    graph: str = "eager",
) -> BatchRunner:
    runner = _create(model, device, pad_id, threads, cache_release_fraction, graph)
    runner.set_parallel(parallel_passes)
    return runner


def ready_runner(
    model: ResolvedModel,
    device: str,
    warm_up_batch: int,
    threads: int | None = None,
    cache_release_fraction: float = 0.9,
    parallel_passes: int = 1,
    graph: str = "eager",
) -> BatchRunner:
    """A replica's runner, built and warmed up (its first passes compile and allocate)."""
    runner = create_runner(
        model,
        device,
        threads=threads,
        cache_release_fraction=cache_release_fraction,
        parallel_passes=parallel_passes,
        graph=graph,
    )
    runner.warm_up(model.manifest.input.max_tokens, warm_up_batch)
    return runner


def _create(
    model: ResolvedModel,
    device: str,
    pad_id: int | None,
    threads: int | None,
    cache_release_fraction: float,
    graph: str,
) -> BatchRunner:
    pad = pad_token_id(model.tokenizer_file) if pad_id is None else pad_id
    if model.manifest.format == "onnx":
        from deployments.runtime.onnx_runner import OnnxRunner

        return OnnxRunner(model, device, pad, threads)
    import torch

    from deployments.runtime.torch_runner import ModelRunner, pick_device

    if threads:
        torch.set_num_threads(threads)
    return ModelRunner(model, pick_device(device), pad, cache_release_fraction, graph)
