"""Load a ``generate`` model: the causal LM of a checked manifest, in its configured precision."""

from __future__ import annotations

import logging

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from deployments.repository.manifest import ResolvedModel
from deployments.runtime.torch_runner import pick_device

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
log = logging.getLogger("textserve.generate")


def load_causal_lm(model: ResolvedModel, device: str = "auto") -> PreTrainedModel:
    # SDPA: masked (left-padded) rows of the batch cost no softmax mass; the same kernel generate() uses.
    lm = AutoModelForCausalLM.from_pretrained(
        model.weights_dir, dtype=DTYPES[model.precision], attn_implementation="sdpa"
    )
    if model.precision != "fp32":
        # Half-precision rounding is coarse enough that a row's numbers depend on its batch (README).
        log.warning(
            "%s: greedy output depends on what shares the batch in %s (fp32 keeps it equal to "
            "model.generate's)",
            model.manifest.name,
            model.precision,
        )
    return lm.to(pick_device(device)).eval()
