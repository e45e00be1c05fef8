"""Model versions served side by side: the stable one and an optional candidate (canary).

Each version has its own tokenizer and inference deployments (a "lane"). A request that pins a version
(``model: name:version``) goes to that lane; others go to the candidate with the configured share.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from deployments.repository.manifest import Manifest, ResolvedModel


@dataclass(frozen=True)
class Lane:
    model: ResolvedModel
    tokenizer: Any  # a DeploymentHandle in the replica (a bound Application while the graph is built)
    inference: Any

    @property
    def manifest(self) -> Manifest:
        return self.model.manifest

    @property
    def version(self) -> str:
        return self.model.manifest.version


class Lanes:
    def __init__(self, lanes: list[Lane], draw: Callable[[], float] = random.random) -> None:
        if not lanes:
            raise ValueError("at least one model version must be served")
        self.stable = lanes[0]
        self.candidate = lanes[1] if len(lanes) > 1 else None
        self.by_version = {lane.version: lane for lane in lanes}
        if len(self.by_version) != len(lanes):
            raise ValueError(f"model versions served twice: {[lane.version for lane in lanes]}")
        self.versions = list(self.by_version)
        self._draw = draw

    def choose(self, pinned: str | None, candidate_share: float) -> Lane:
        if pinned is not None:
            return self.by_version[pinned]
        if self.candidate is not None and candidate_share > 0.0 and self._draw() < candidate_share:
            return self.candidate
        return self.stable

    def __iter__(self) -> Iterator[Lane]:
        return iter(self.by_version.values())


def model_entry(m: Manifest, model_id: str, role: str, share: float) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": model_id,
        "object": "model",
        "owned_by": "textserve",
        "version": m.version,
        "role": role,
        "traffic_share": round(share, 6),
        "task": m.task,
        "max_tokens": m.input.max_tokens,
    }
    if m.task == "embed":
        entry["dimension"] = m.output.dimension
    else:
        entry["labels"] = list(m.output.labels or ())
    return entry
