"""What a model application tells the router about itself: its card. No Ray here.

The router asks each model's ``Model`` deployment for its card and routes by it: which versions are
served, with which traffic share. A new version rolled into the same
deployment names only changes the card, so the router follows a rollout without being redeployed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from deployments.repository.manifest import Manifest

Role = Literal["stable", "candidate"]
# Deployment names per role inside a model's application. Names follow the role, not the version, so
# that a new stable version is a rolling update of the same deployments (new replicas warm first).
ROLE_PREFIX: dict[Role, str] = {"stable": "", "candidate": "Candidate"}
TOKENIZER = "Tokenizer"
INFERENCE = "Inference"
SERIALIZER = "Serializer"
MODEL = "Model"  # the application's ingress: its pipeline (groups requests through the stages) and card
RERANK_ROUTES = ("/v1/rerank", "/v2/rerank", "/rerank")
ROUTES: dict[str, tuple[str, ...]] = {
    "embed": ("/v1/embeddings", "/v2/embed", "/predict", *RERANK_ROUTES),
    "classify": ("/predict",),
    "rerank": RERANK_ROUTES,
    "sparse_embed": ("/embed_sparse",),
    "generate": ("/v1/completions", "/v1/chat/completions"),
}


@dataclass(frozen=True, slots=True)
class LaneCard:
    """One served version of a model and the deployments that serve it."""

    version: str
    role: Role
    share: float  # of the requests that pin no version
    task: str
    max_tokens: int
    dimension: int | None
    labels: tuple[str, ...]
    prompts: tuple[tuple[str, str], ...] = ()  # (name, prefix): a dict is not hashable in a frozen card
    default_prompt: str | None = None
    matryoshka_dimensions: tuple[int, ...] | None = None
    quantization: bool = False  # calibrated int8/uint8 ranges in the manifest
    max_new_tokens: int | None = None  # task generate: the largest max_tokens a request may ask

    @property
    def prompt_table(self) -> dict[str, str]:
        return dict(self.prompts)

    @property
    def routes(self) -> tuple[str, ...]:
        """The HTTP routes this version answers (``/tokenize`` takes every encoder)."""
        return ROUTES[self.task] + (() if self.task == "generate" else ("/tokenize",))

    @property
    def tokenizer(self) -> str:
        return ROLE_PREFIX[self.role] + TOKENIZER

    @property
    def inference(self) -> str:
        return ROLE_PREFIX[self.role] + INFERENCE

    @classmethod
    def of(cls, manifest: Manifest, role: Role, share: float) -> LaneCard:
        return cls(
            version=manifest.version,
            role=role,
            share=share,
            task=manifest.task,
            max_tokens=manifest.input.max_tokens,
            dimension=manifest.output.dimension,
            labels=tuple(manifest.output.labels or ()),
            prompts=tuple(sorted(manifest.prompts.items())),
            default_prompt=manifest.default_prompt_name,
            matryoshka_dimensions=manifest.matryoshka_dimensions,
            quantization=manifest.quantization is not None,
        )


@dataclass(frozen=True, slots=True)
class ModelCard:
    """A model's name and its served versions, stable first."""

    name: str
    lanes: tuple[LaneCard, ...]
    # The answering replica's link socket (its file name), if it listens on one: the card comes by Serve's
    # handle, which stops routing to a replica as soon as Serve stops it, so the router uses only the
    # sockets of replicas whose cards keep coming (deployments/link/client.py).
    link: str | None = None

    @property
    def stable(self) -> LaneCard:
        return self.lanes[0]

    @property
    def candidate(self) -> LaneCard | None:
        return self.lanes[1] if len(self.lanes) > 1 else None

    def lane(self, version: str) -> LaneCard | None:
        return next((lane for lane in self.lanes if lane.version == version), None)

    @property
    def versions(self) -> list[str]:
        return [lane.version for lane in self.lanes]


def lane_entry(model_id: str, lane: LaneCard, share: float, default: bool) -> dict[str, Any]:
    """One ``GET /v1/models`` entry (OpenAI's shape, with what a client needs to use the model)."""
    entry: dict[str, Any] = {
        "id": model_id,
        "object": "model",
        "owned_by": "textserve",
        "version": lane.version,
        "role": lane.role,
        "traffic_share": round(share, 6),
        "task": lane.task,
        "routes": list(lane.routes),
        "max_tokens": lane.max_tokens,
        "default": default,
    }
    if lane.task == "classify":
        entry["labels"] = list(lane.labels)
    elif lane.task not in ("rerank", "generate"):
        entry["dimension"] = lane.dimension
    if lane.prompts:
        entry["prompts"] = lane.prompt_table
        entry["default_prompt_name"] = lane.default_prompt
    if lane.task == "embed":
        entry["matryoshka_dimensions"] = list(lane.matryoshka_dimensions or [])
        entry["embedding_types"] = ["float", "binary", "ubinary"] + (
            ["int8", "uint8"] if lane.quantization else []
        )
    return entry


def model_entries(card: ModelCard, default: bool) -> list[dict[str, Any]]:
    """The model by its name (what unpinned requests get), then each served version as ``name:version``."""
    entries = [lane_entry(card.name, card.stable, card.stable.share, default)]
    for lane in card.lanes:
        entries.append(lane_entry(f"{card.name}:{lane.version}", lane, lane.share, default))
    return entries
