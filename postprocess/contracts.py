"""What the inference stage hands to the serializer, and what the serializer hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from postprocess.completions import FinishReason, Usage
from preprocess.contracts import TraceContext
from preprocess.errors import ServiceError

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
class ModelOutput:
    """One request's model results, row ``i`` for input ``i``."""

    model: ModelIdentity
    task: Task
    values: np.ndarray  # float32: (n, dim) embeddings, or (n, n_labels) class probabilities
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


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    """A piece of one generation's stream, model → ingress: new text, and on the last piece the finish
    reason and usage; or an error (before the first piece: an HTTP error; after: an error event)."""

    text: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: ServiceError | None = None
