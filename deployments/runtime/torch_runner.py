"""The torch backend: a Hugging Face model in ``torch.inference_mode`` on CPU or CUDA. No Ray."""

from __future__ import annotations

import logging

import numpy as np
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

from deployments.repository.manifest import ManifestError, ResolvedModel
from deployments.runtime.cuda_memory import CacheRelease
from deployments.runtime.packed_linear import packs
from deployments.runtime.runner_base import BatchRunner
from deployments.runtime.torch_graph import eager_head, traced_head
from preprocess.tokenize import sep_token_id


def pick_device(requested: str) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


# What each task loads: bare encoder (pooled here), a classification head, or the masked-LM head (SPLADE).
MODEL_CLASSES = {
    "embed": AutoModel,
    "classify": AutoModelForSequenceClassification,
    "rerank": AutoModelForSequenceClassification,
    "sparse_embed": AutoModelForMaskedLM,
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Packed linear weights where they pay at every batch shape (packed_linear.py); fp32 is slower at one row.
ENCODER_PACKS = (torch.bfloat16,)

log = logging.getLogger("textserve.runner")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere bf16 is emulated, slowly."""
    caps = torch.cpu.get_capabilities()
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


class ModelRunner(BatchRunner):
    backend = "torch"

    def __init__(
        self,
        model: ResolvedModel,
        device: torch.device,
        pad_id: int,
        cache_release_fraction: float = 0.9,
        graph: str = "eager",
    ) -> None:
        if graph not in ("eager", "trace"):
            raise ValueError(f"torch_graph must be eager or trace, not {graph!r}")
        super().__init__(model, pad_id)
        self.device = device
        self._cache_release = CacheRelease(device, cache_release_fraction)
        cls = MODEL_CLASSES[self.task]
        self.model = (
            cls.from_pretrained(str(model.weights_dir), dtype=DTYPES[model.precision]).to(device).eval()
        )
        self._check_loaded()
        if device.type == "cpu" and model.precision == "bf16" and not cpu_has_bf16():
            log.warning("precision bf16 on a CPU without bf16 instructions runs slowly: set precision fp32")
        m = model.manifest
        sep = sep_token_id(model.tokenizer_file)
        if graph == "trace":
            pack = packs(device, DTYPES[model.precision], ENCODER_PACKS)
            self._head = traced_head(self.model, self.task, m.pooling, m.normalize, device, sep, pack)
        else:
            self._head = eager_head(self.model, self.task, m.pooling, m.normalize, sep)
        self.graph = graph

    @property
    def device_name(self) -> str:
        return str(self.device)

    def _check_loaded(self) -> None:
        # The weights as loaded, not just their config file, must fit the manifest's output signature.
        config = self.model.config
        have, field = {
            "embed": (config.hidden_size, "output.dimension"),
            "classify": (config.num_labels, "output.labels"),
            "rerank": (config.num_labels, "task"),
            "sparse_embed": (config.vocab_size, "output.dimension"),
        }[self.task]
        if have != self.output_size:
            raise ManifestError(field, f"loaded model gives {have}", self.model_info.manifest_path)

    @torch.inference_mode()
    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        input_ids = torch.from_numpy(ids).to(self.device, non_blocking=True)
        attention = torch.from_numpy(mask).to(self.device, non_blocking=True)
        return self._head(input_ids, attention).cpu().numpy()

    def _release_memory(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _after_batch(self) -> None:
        self._cache_release()  # only above the threshold: a release costs a sync and fresh allocations
