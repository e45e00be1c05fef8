"""Load a ``generate`` model: the causal LM of a checked manifest, in its configured precision."""

from __future__ import annotations

import logging

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from deployments.repository.manifest import ResolvedModel
from deployments.runtime.generate.row_attention import use_row_groups
from deployments.runtime.packed_linear import pack_linears, packs
from deployments.runtime.torch_runner import DTYPES, pick_device

log = logging.getLogger("textserve.generate")


def load_causal_lm(
    model: ResolvedModel, device: str = "auto", packed: bool = False, row_groups: bool = False
) -> PreTrainedModel:
    """For the engine's own copy, which is never trained or saved: ``packed``, the linear layers on oneDNN's
    packed weights where the model can use them (fp32 on CPU; otherwise as loaded); ``row_groups``, decode
    attention by groups of rows (row_attention.py) where the model runs SDPA."""
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
    target = pick_device(device)
    lm = lm.to(target).eval()
    # fp32 only: a decode step's few rows are where MKL's sgemm is slow; other precisions run as loaded.
    if packed and packs(target, DTYPES[model.precision], (torch.float32,)):
        pack_linears(lm)
    if row_groups and use_row_groups(lm):
        log.info("%s: decode attention by groups of rows", model.manifest.name)
    return lm
