"""What the inference stage hands to the serializer, and what the serializer hands back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from preprocess.contracts import TraceContext

Task = Literal["embed", "classify"]
Route = Literal["embeddings", "predict"]
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

    def __post_init__(self) -> None:
        if self.values.ndim != 2:
            raise ValueError(f"values must be 2-D, got shape {self.values.shape}")
        if self.task == "classify" and self.values.shape[1] != len(self.labels):
            raise ValueError("classify output needs one label per column")


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    """How the client asked to receive the result."""

    route: Route
    media_type: MediaType = JSON
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    # The id the client named the model by (its application's name); empty: the manifest's name.
    model_id: str = ""


@dataclass(frozen=True, slots=True)
class SerializedResponse:
    body: bytes
    media_type: MediaType
    model_version: str
