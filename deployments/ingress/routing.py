"""Which model and which version answers a request: the router's table of model cards. No Ray here.

A request names ``model`` as ``name`` (the stable version, or the candidate for its traffic share),
``name:version`` (that version only) or nothing (the default model). Anything else is a 404 that
names what is served.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contracts.errors import ModelNotFoundError, NotReadyError
from deployments.config import LimitsConfig
from deployments.ingress.limits import lane_limits
from deployments.pipeline.card import LaneCard, ModelCard, model_entries


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes: a model application and one of its served versions."""

    model: str
    lane: LaneCard
    pinned: bool = False  # the client named the version (name:version): no other version may answer


class ModelRouter:
    def __init__(self, models: list[str], default: str, draw: Callable[[], float] = random.random) -> None:
        if default not in models:
            raise ValueError(f"default model {default!r} is not one of {models}")
        self.models = list(models)
        self.default = default
        self.cards: dict[str, ModelCard] = {}
        self._draw = draw

    def update(self, card: ModelCard) -> None:
        if card.name not in self.models:
            raise ValueError(f"card for {card.name!r}, which this router does not serve")
        self.cards[card.name] = card

    def route(self, requested: str | None) -> Route:
        name, version = self._parse(requested)
        card = self.cards.get(name)
        if card is None:
            raise NotReadyError(f"model {name!r} is starting; retry shortly")
        if version is None:
            candidate = card.candidate
            if candidate is not None and candidate.share > 0.0 and self._draw() < candidate.share:
                return Route(name, candidate)
            return Route(name, card.stable)
        lane = card.lane(version)
        if lane is None:
            raise ModelNotFoundError(
                f"model {requested!r} is not served here; {name!r} serves versions {card.versions}; "
                f"served models: {self._served()}",
                "model",
            )
        return Route(name, lane, pinned=True)

    def _parse(self, requested: str | None) -> tuple[str, str | None]:
        if requested is None or requested == "":
            return self.default, None
        if requested in self.models:
            return requested, None
        name, sep, version = requested.rpartition(":")
        if sep and name in self.models:
            return name, version
        raise ModelNotFoundError(
            f"model {requested!r} is not served here; served models: {self._served()}", "model"
        )

    def _served(self) -> str:
        return ", ".join(repr(m) for m in self.models)

    def entries(self, limits: LimitsConfig) -> list[dict[str, Any]]:
        """``GET /v1/models``: every model whose card is known, by name and by ``name:version``, each with
        the ``limits`` its version is served under (``limits``: the router's own)."""
        out: list[dict[str, Any]] = []
        for name in self.models:
            card = self.cards.get(name)
            if card is None:
                continue
            for entry in model_entries(card, default=name == self.default):
                lane = card.lane(entry["version"])
                assert lane is not None  # every entry is one of the card's lanes
                entry["limits"] = lane_limits(lane, limits)
                out.append(entry)
        return out
