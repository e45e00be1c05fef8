"""A causal LM's linear layers on oneDNN's packed weights (fp32, CPU).

A decode step multiplies a few rows (one per running sequence) by every weight of the model. On CPU,
PyTorch's default kernel for that (MKL's sgemm on a plain row-major weight) reaches a fraction of the
memory bandwidth; oneDNN, on the same weight reordered once into its blocked layout, reads it at a much
larger share (docs/architecture.md, decision log). Both are fp32 with fp32 accumulation; the results differ
from MKL's in the last bits only, as MKL's own do between a batch of 8 rows and the same rows one by one.

``pack_linears`` swaps every ``nn.Linear`` and GPT-2 ``Conv1D`` of the model for a ``PackedLinear``.
It is used for the engine's own copy of the model only: the weights are not trainable afterwards,
and ``state_dict`` no longer holds them.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

log = logging.getLogger("textserve.generate")

ROWS_HINT = 8  # the packed layout is chosen for about this many rows; every count works (and is fast)


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` held in oneDNN's layout (an opaque ``torch._mkldnn`` tensor)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(n) for n in weight.shape)
        # Plain attributes, not buffers: model.to() / state_dict() cannot handle the opaque layout.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ROWS_HINT)
        self.bias = None if bias is None else bias.detach().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn packed"


def packable(model: nn.Module) -> bool:
    """oneDNN is in this PyTorch build, and the model is fp32 on CPU (its other dtypes, and GPUs, have
    their own fast kernels)."""
    param = next(model.parameters(), None)
    return (
        param is not None
        and param.device.type == "cpu"
        and param.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def pack_linears(model: nn.Module) -> int:
    """Swap the model's linear layers for packed ones, in place; how many were swapped (0 when the
    model or this PyTorch build cannot use them: the model then runs as loaded)."""
    if not packable(model):
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                weight = child.weight
            elif isinstance(child, Conv1D):  # GPT-2's: y = x W + b, W stored (in, out)
                weight = child.weight.t()
            else:
                continue
            setattr(parent, name, PackedLinear(weight, child.bias))
            swapped += 1
    return swapped
