"""The CUDA allocator settings every model replica applies, whatever its task (encoder or generate).

``apply_alloc_conf``: ``RuntimeConfig.cuda_alloc_conf`` as ``PYTORCH_CUDA_ALLOC_CONF``, which the caching
allocator reads once, when CUDA initializes: call it before anything touches CUDA (before the model
loads). A value already in the environment wins (an operator's override).

``CacheRelease``: ``torch.cuda.empty_cache()`` after a batch or a decode step only while the allocator
holds more than ``RuntimeConfig.cuda_cache_release_fraction`` of the device's memory; releasing on every
step would cost a synchronization and fresh allocations each time. Nothing on a CPU device.
"""

from __future__ import annotations

import logging
import os

import torch

ENV = "PYTORCH_CUDA_ALLOC_CONF"
log = logging.getLogger("textserve.runner")


def apply_alloc_conf(conf: str | None) -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF`` to ``conf`` unless the environment already has it; True if set here.
    Warns when CUDA is already initialized in this process (then the allocator keeps its settings)."""
    if not conf or ENV in os.environ:
        return False
    if torch.cuda.is_initialized():
        log.warning("%s=%s set after CUDA initialized: the allocator ignores it", ENV, conf)
    os.environ[ENV] = conf
    return True


class CacheRelease:
    """Whether to release, and releasing, the allocator's cache of one device above a share of its memory."""

    def __init__(self, device: torch.device | str, fraction: float) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"cuda_cache_release_fraction must be in (0, 1], not {fraction}")
        self.device = torch.device(device)
        self.fraction = fraction
        self._limit: float | None = None  # bytes; read at the first check (the device is set up by then)
        self.releases = 0

    def __call__(self) -> bool:
        """After a batch or step: ``empty_cache`` when reserved memory is over the limit; True if released."""
        if self.device.type != "cuda":
            return False
        if self._limit is None:
            self._limit = self.fraction * torch.cuda.get_device_properties(self.device).total_memory
        if torch.cuda.memory_reserved(self.device) <= self._limit:
            return False
        torch.cuda.empty_cache()
        self.releases += 1
        return True
