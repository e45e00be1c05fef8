"""Choosing each row's next token: greedy, or temperature and nucleus (top-p) sampling per request.

Every sampled request has its own ``torch.Generator``, seeded from the request's ``seed`` when given, so
a seeded request draws the same tokens whatever else shares its batch. The generator lives on the
logits' device (made at the request's first draw): a draw never moves the logits to the CPU, and a CUDA
generator cannot take CPU tensors nor a CPU one CUDA tensors. A seed therefore repeats per device: the
same seed draws the same tokens on every run on CUDA and on every run on the CPU, not the same tokens on
both (their random streams differ).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy (argmax), as model.generate(do_sample=False)
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(slots=True)
class Sampler:
    params: Sampling
    seed: int = field(default=0, init=False)
    generator: torch.Generator | None = field(default=None, init=False)
    _device: torch.device | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.params.greedy:
            self.seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)

    def generator_on(self, device: torch.device) -> torch.Generator:
        """The request's generator on ``device``, seeded at its first use there (later draws continue it)."""
        if self.generator is None or self._device != device:
            self.generator = torch.Generator(device=device).manual_seed(self.seed)
            self._device = device
        return self.generator


NON_FINITE = -1  # next_tokens' token for a row whose logits hold a NaN or an infinity


def next_tokens(logits: torch.Tensor, samplers: list[Sampler]) -> list[int]:
    """``logits``: (rows, vocabulary) for the last position of each row, on any device. One copy to the
    host for the whole batch. A row with a non-finite logit gets ``NON_FINITE``: argmax would pick a NaN's
    index and sampling would fail, and either would pass for a token."""
    chosen = logits.argmax(dim=-1)
    finite = torch.isfinite(logits).all(dim=-1)
    for row, sampler in enumerate(samplers):
        if not sampler.params.greedy:
            chosen[row] = draw(logits[row], sampler) if bool(finite[row]) else NON_FINITE
    return torch.where(finite, chosen, NON_FINITE).tolist()


def probabilities(logits: torch.Tensor, params: Sampling) -> torch.Tensor:
    """The distribution a sampled request draws from: softmax at its temperature, outside the top-p
    nucleus zeroed and the rest renormalized (a speculative check reads a token's probability from it).
    ``logits``: (..., vocabulary)."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def draw(logits: torch.Tensor, sampler: Sampler) -> torch.Tensor:
    """One sampled token id of a row's ``logits`` (vocabulary,), as a 0-d tensor on their device."""
    probs = probabilities(logits, sampler.params)
    return torch.multinomial(probs, 1, generator=sampler.generator_on(probs.device))[0]
