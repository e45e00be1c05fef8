"""Choosing each row's next token: greedy, or temperature and nucleus (top-p) sampling per request.

Every sampled request has its own ``torch.Generator``, seeded from the request's ``seed`` when given,
so a seeded request draws the same tokens whatever else shares its batch.
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
    generator: torch.Generator | None = field(default=None)

    def __post_init__(self) -> None:
        if not self.params.greedy:
            seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)
            self.generator = torch.Generator().manual_seed(seed)


def next_tokens(logits: torch.Tensor, samplers: list[Sampler]) -> list[int]:
    """``logits``: (rows, vocabulary) for the last position of each row, float."""
    chosen = logits.argmax(dim=-1).tolist()
    for row, sampler in enumerate(samplers):
        if not sampler.params.greedy:
            chosen[row] = _sample(logits[row].float(), sampler)
    return chosen


def _sample(logits: torch.Tensor, sampler: Sampler) -> int:
    probs = torch.softmax(logits / sampler.params.temperature, dim=-1)
    top_p = sampler.params.top_p
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs[drop] = 0.0
        pick = torch.multinomial(sorted_probs, 1, generator=sampler.generator)
        return int(order[pick])
    return int(torch.multinomial(probs, 1, generator=sampler.generator))
