"""The batched inference deployment: ``@serve.batch`` over the pure ``ModelRunner``."""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from ray import serve

from deployments.config import BatchingConfig, RuntimeConfig
from deployments.manifest import ResolvedModel
from deployments.model_repo import recheck_on_replica
from deployments.model_runner import ModelRunner, pick_device
from postprocess.contracts import ModelIdentity, ModelOutput
from preprocess.contracts import EncodedTexts
from preprocess.tokenize import pad_token_id

log = logging.getLogger("ray.serve")

_DEFAULTS = BatchingConfig()


@serve.deployment(name="Inference", ray_actor_options={"num_cpus": 1.0}, max_ongoing_requests=128)
class InferenceDeployment:
    def __init__(self, model: ResolvedModel, device: str, runtime: RuntimeConfig) -> None:
        recheck_on_replica(model, runtime.verify_checksums)
        if runtime.torch_threads:
            torch.set_num_threads(runtime.torch_threads)
        manifest = model.manifest
        self._identity = ModelIdentity(name=manifest.name, version=manifest.version)
        self._labels = tuple(manifest.output.labels or ())
        self._batching = _DEFAULTS
        self._runner = ModelRunner(model, pick_device(device), pad_token_id(model.tokenizer_file))
        # One thread runs the model so the event loop keeps admitting requests into the next batch.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self._runner.warm_up(manifest.input.max_tokens, _DEFAULTS.max_batch_size)
        log.info("model %s v%s ready on %s", manifest.name, manifest.version, self._runner.device)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        config = BatchingConfig.model_validate(user_config)
        self._infer_batch.set_max_batch_size(config.max_batch_size)
        self._infer_batch.set_batch_wait_timeout_s(config.batch_wait_timeout_s)
        self._batching = config

    async def infer(self, encoded: EncodedTexts) -> ModelOutput:
        return await self._infer_batch(encoded)

    @serve.batch(max_batch_size=_DEFAULTS.max_batch_size, batch_wait_timeout_s=_DEFAULTS.batch_wait_timeout_s)
    async def _infer_batch(self, items: list[EncodedTexts]) -> list[ModelOutput]:
        # An exception here fails every future of this batch (Serve sets it on each): none hangs.
        sequences = [seq for item in items for seq in item.sequences()]
        loop = asyncio.get_running_loop()
        values = await loop.run_in_executor(
            self._executor, self._runner.run, sequences, self._batching.max_batch_size
        )
        if len(values) != len(sequences):
            raise RuntimeError(f"model returned {len(values)} rows for {len(sequences)} inputs")
        outputs: list[ModelOutput] = []
        start = 0
        for item in items:
            end = start + len(item)
            outputs.append(
                ModelOutput(
                    model=self._identity,
                    task=self._runner.task,
                    values=values[start:end],
                    token_count=item.token_count,
                    labels=self._labels,
                    truncated=item.truncated,
                )
            )
            start = end
        return outputs

    def batching(self) -> dict[str, Any]:
        """The batching settings in force and this replica's pid (to show reconfigure needs no restart)."""
        return {**self._batching.model_dump(), "pid": os.getpid()}

    def ready(self) -> ModelIdentity:
        """Answered only once __init__ (load + warm-up) has finished."""
        return self._identity
