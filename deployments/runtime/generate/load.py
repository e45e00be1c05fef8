"""Load a ``generate`` model: the causal LM of a checked manifest, in its configured precision."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from deployments.repository.manifest import ResolvedModel
from deployments.runtime.torch_runner import pick_device

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def load_causal_lm(model: ResolvedModel, device: str = "auto") -> PreTrainedModel:
    # SDPA: masked (left-padded) rows of the batch cost no softmax mass; the same kernel generate() uses.
    lm = AutoModelForCausalLM.from_pretrained(
        model.weights_dir, dtype=DTYPES[model.precision], attn_implementation="sdpa"
    )
    return lm.to(pick_device(device)).eval()
