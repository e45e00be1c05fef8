"""Linear layers on weights packed once in oneDNN's blocked layout (CPU). No Ray.

On a CPU, torch multiplies by a linear layer's weight as stored, row-major: in fp32 through MKL's sgemm,
which reads it at a fraction of the memory bandwidth when there are few rows; in bf16 through oneDNN,
which reorders the weight into its blocked layout on every call, as costly as the product itself for a
short batch. Packing each weight once into oneDNN's layout, as Inductor's freezing and IPEX do, leaves
only the product. The results differ from the plain kernel's in the last bits at most.

Two places use it, each where it pays at every batch shape (docs/architecture.md, decision log):
- the generation engine's own copy of a model, fp32 (``generate/load.py``, ``generation.packed_weights``):
  a decode step is a few rows per weight;
- an encoder's traced graph, bf16 (``torch_graph.traced_head``, checked at start against the model as
  loaded). An fp32 encoder stays as loaded: for it the packed op is slower on a batch of one row.

The packed weights are plain attributes, not parameters or buffers: ``model.to()`` and ``state_dict()``
cannot handle their opaque layout, so a packed model is never moved, trained or saved.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Union  # noqa: UP035 - TorchScript reads these annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

log = logging.getLogger("textserve.runner")

ROWS_HINT = 8  # the packed layout is chosen for about this many rows; every count works (and is fast)


class PackedLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` held in oneDNN's layout (an opaque ``torch._mkldnn`` tensor)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(n) for n in weight.shape)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), ROWS_HINT)
        self.bias = None if bias is None else bias.detach().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Typed for TorchScript, which a trace needs: the tracer cannot record an empty list of scalars.
        scalars: List[Optional[Union[int, float, complex]]] = []  # noqa: UP006, UP007, UP045
        rows = x.reshape(-1, self.in_features).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", scalars, "")
        return out.reshape(list(x.shape[:-1]) + [self.out_features])  # noqa: RUF005 - TorchScript

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn packed"


def packs(device: torch.device, dtype: torch.dtype, dtypes: tuple[torch.dtype, ...]) -> bool:
    """Whether weights of ``dtype`` on ``device`` are packed, for a caller that packs ``dtypes``: a CPU,
    and a torch built with oneDNN's linear op (other devices have their own fast kernels)."""
    return (
        device.type == "cpu"
        and dtype in dtypes
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def pack_linears(model: nn.Module, script: bool = False) -> int:
    """Swap the model's linear layers (``nn.Linear``, GPT-2's ``Conv1D``) for packed ones, in place; how
    many were swapped. ``script``: each as TorchScript, so that a trace records it as one call. A layer
    whose weight is tied to another parameter (a masked-LM decoder and the embeddings) gets a packed copy;
    the other keeps the plain one."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                weight = child.weight
            elif isinstance(child, Conv1D):  # GPT-2's: y = x W + b, W stored (in, out)
                weight = child.weight.t()
            else:
                continue
            layer: nn.Module = PackedLinear(weight, child.bias)
            setattr(parent, name, torch.jit.script(layer) if script else layer)
            swapped += 1
    if swapped:
        log.info("%d linear layers on oneDNN packed weights", swapped)
    return swapped
