"""What the inference stage hands to the serializer, and what the serializer hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from contracts.errors import ServiceError
from contracts.tokenized import TraceContext

Task = Literal["embed", "classify", "rerank", "sparse_embed"]
Route = Literal["embeddings", "predict", "rerank", "rerank_tei", "cohere_embed", "embed_sparse"]
EncodingFormat = Literal["float", "base64"]

JSON = "application/json"
MSGPACK = "application/msgpack"
MediaType = Literal["application/json", "application/msgpack"]


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    name: str
    version: str


@dataclass(frozen=True, slots=True)
class SparseRows:
    """Rows of an (n, width) matrix that is mostly zeros, in CSR form: row ``i`` holds the columns
    ``indices[indptr[i]:indptr[i + 1]]`` with those ``weights``. A SPLADE row is a vocabulary-wide
    vector (30,522 floats for BERT's) with a few hundred non-zeros at most, so rows travel between
    replicas in this form: about a hundredth of the dense bytes."""

    indptr: np.ndarray  # int64, n + 1
    indices: np.ndarray  # int32, the non-zero columns of every row, row after row
    weights: np.ndarray  # float32, their values
    width: int

    @classmethod
    def of(cls, dense: np.ndarray, threshold: float = 0.0) -> SparseRows:
        """The entries of ``dense`` (2-D) above ``threshold``; the others are dropped as zeros."""
        rows, cols = np.nonzero(dense > threshold)
        indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=dense.shape[0]), out=indptr[1:])
        weights = dense[rows, cols].astype(np.float32, copy=False)
        return cls(indptr, cols.astype(np.int32), weights, int(dense.shape[1]))

    @property
    def ndim(self) -> int:
        return 2

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.indptr) - 1, self.width)

    @property
    def size(self) -> int:
        """Values stored (the non-zeros): what serializing the rows costs."""
        return len(self.weights)

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``i``'s columns (ascending) and weights."""
        start, end = self.indptr[i], self.indptr[i + 1]
        return self.indices[start:end], self.weights[start:end]

    def dense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=np.float32)
        for i in range(len(self)):
            columns, weights = self.row(i)
            out[i, columns] = weights
        return out


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """One request's model results, row ``i`` for input ``i``."""

    model: ModelIdentity
    task: Task
    # float32: (n, dim) embeddings, or (n, n_labels) class probabilities; sparse_embed: SparseRows
    values: np.ndarray | SparseRows
    token_count: int
    labels: tuple[str, ...] = ()
    truncated: int = 0
    trace: TraceContext | None = None
    activation: str = ""  # rerank: the manifest's score activation over the raw logit

    def __post_init__(self) -> None:
        if self.values.ndim != 2:
            raise ValueError(f"values must be 2-D, got shape {self.values.shape}")
        if self.task == "classify" and self.values.shape[1] != len(self.labels):
            raise ValueError("classify output needs one label per column")


@dataclass(frozen=True, slots=True)
class RerankOptions:
    """What a rerank answer holds. The documents travel only when the client asked for them back."""

    top_n: int | None = None
    documents: tuple[str, ...] | None = None
    raw_scores: bool = False  # TEI: the cross-encoder's logit without its activation


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    """How the client asked to receive the result."""

    route: Route
    media_type: MediaType = JSON
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    # The id the client named the model by (its application's name); empty: the manifest's name.
    model_id: str = ""
    embedding_types: tuple[str, ...] = ()  # compact embeddings (postprocess/quantize.py); () is float
    rerank: RerankOptions | None = None
    request_id: str = ""  # Cohere's responses carry an id


@dataclass(frozen=True, slots=True)
class SerializedResponse:
    body: bytes
    media_type: MediaType
    model_version: str
    input_tokens: int = 0  # what the model read for it: charged to the tenant's tokens/min


FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    """A piece of one generation's stream, model → ingress: new text, and on the last piece the finish
    reason and usage; or an error (before the first piece: an HTTP error; after: an error event)."""

    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: ServiceError | None = None
