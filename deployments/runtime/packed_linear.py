"""Linear layers with their weights packed once in oneDNN's blocked layout (CPU, bf16). No Ray.

A plain ``nn.Linear`` in bf16 on a CPU goes through oneDNN, which reorders the weight into its blocked
layout on every call; for the few rows of a short batch, that reordering costs about as much as the
product itself. Packing each weight once, as Inductor's freezing and IPEX do, leaves only the product.
The packed op computes the same products; the traced graph is checked against the unpacked model at
start (``torch_graph.traced_head``). fp32 is left as is: there oneDNN's packed op is not faster than
torch's own kernels at every batch shape. Only the traced graph packs: eager is the module as loaded.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Union  # noqa: UP035 - TorchScript reads these annotations

import torch

log = logging.getLogger("textserve.runner")


class PackedLinear(torch.nn.Module):
    """``nn.Linear``'s forward on a weight packed once; scripted, so a trace records it as one call."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Tracing cannot record the op's empty list of optional scalars; TorchScript needs its exact type.
        scalars: List[Optional[Union[int, float, complex]]] = []  # noqa: UP006, UP007, UP045
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", scalars, "")


def packs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch can pack linear weights for ``device`` and ``dtype`` (a CPU, bf16, oneDNN)."""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


@torch.inference_mode()
def pack_linears(module: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by a ``PackedLinear``, in place; returns how many.
    A linear whose weight is tied to another parameter (a masked-LM head's decoder and the embeddings)
    gets a packed copy; the embedding keeps the plain one."""
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, torch.jit.script(PackedLinear(child)))
            replaced += 1
        else:
            replaced += pack_linears(child)
    return replaced


def pack_model(model: torch.nn.Module) -> None:
    """``pack_linears`` on a whole model, logged."""
    log.info("linear layers packed for oneDNN: %d", pack_linears(model))
