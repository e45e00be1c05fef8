"""What the tokenizer stage hands to the inference stage."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:  # an annotation only: the parsed body's type lives with its parser
    from preprocess.generation import GenerationRequest


# A tenant's class (its policy in the tenants file): interactive work is batched ahead of bulk work.
Priority = Literal["interactive", "batch"]


@dataclass(frozen=True, slots=True)
class TraceContext:
    """What a sampled request carries between stages (see deployments/observability/tracing.py): its
    trace, its root span and its request id. Unsampled requests carry None."""

    trace_id: int
    span_id: int
    request_id: str


@dataclass(frozen=True, slots=True)
class TokenizeJob:
    """One request's inputs for the tokenizer stage: texts, or token ids the client made itself; for a
    rerank, the query too (documents in ``texts``)."""

    texts: list[str]
    truncate: bool = False
    deadline: float | None = None  # epoch seconds; past it the request is dropped before the model
    request_id: str = ""
    trace: TraceContext | None = None
    prompt: str = ""  # prepended to every text (the model's named prompt); its tokens count
    token_ids: list[list[int]] | None = None  # instead of texts: ids without special tokens
    query: str | None = None  # rerank: pairs with a cross-encoder, else embedded first
    query_prompt: str = ""
    max_tokens: int | None = None  # rerank: each document cut to this many of its own tokens
    # How the client named what it sent, for errors: the body's field holding the texts (its ``param``,
    # ``texts[3]``) and how that route asks for truncation.
    field: str = "input"
    truncate_hint: str = '"truncate": true'

    @property
    def inputs(self) -> int:
        """Sequences the job makes: its texts (or id lists), and a rerank's query."""
        count = len(self.token_ids) if self.token_ids is not None else len(self.texts)
        return count + (self.query is not None)

    @property
    def size(self) -> int:
        """Characters (or ids) to tokenize: what the job costs the tokenizer and, roughly, the model."""
        if self.token_ids is not None:
            return sum(len(ids) for ids in self.token_ids)
        return sum(len(t) for t in self.texts) + len(self.query or "")


@dataclass(frozen=True, slots=True)
class EncodedTexts:
    """Token ids of one request's texts, unpadded and concatenated (cheap to ship between processes).

    Text ``i`` holds ``ids[offsets[i]:offsets[i + 1]]``.
    """

    ids: np.ndarray  # int32, shape (total_tokens,)
    offsets: np.ndarray  # int64, shape (n_texts + 1,)
    truncated: int = 0  # how many texts were cut to the model's token limit
    deadline: float | None = None  # epoch seconds, carried from the request
    trace: TraceContext | None = None
    # Which tokenizer made the ids (a hash of its file): during a rolling update the stages of two versions
    # may meet, and a model must never run another tokenizer's ids. Empty: not checked.
    tokenizer_id: str = ""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def token_count(self) -> int:
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def longest(self) -> int:
        return int(self.lengths.max()) if len(self) else 0

    def sequences(self) -> Iterator[np.ndarray]:
        for start, end in zip(self.offsets[:-1], self.offsets[1:], strict=True):
            yield self.ids[start:end]


@dataclass(frozen=True, slots=True)
class GenerationJob:
    """One completion request for a ``generate`` model: the parsed body (its prompt or chat messages and
    sampling parameters), and what the ingress adds."""

    request: GenerationRequest
    deadline: float  # epoch seconds; the whole generation must end by then (X-Request-Timeout)
    request_id: str = ""
    priority: Priority = "interactive"  # the tenant's class: admitted to the running batch first or not
