"""A model application's ingress: its card (what the router routes by) and its readiness.

It is never on a request's path: the router calls the model's tokenizer, inference and serializer
deployments directly, by name, and only asks this deployment which versions they serve.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ray import serve

from deployments.config import ModelCardConfig
from deployments.pipeline.card import LaneCard, ModelCard, Role
from deployments.repository.manifest import ResolvedModel
from postprocess.contracts import ModelIdentity

READY_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ServedVersion:
    model: ResolvedModel
    inference: Any  # a DeploymentHandle in the replica (a bound Application while the graph is built)


@serve.deployment(name="Model", ray_actor_options={"num_cpus": 0.01}, max_ongoing_requests=64)
class ModelDeployment:
    def __init__(self, versions: list[ServedVersion], tokenizers: list[Any], serializer: Any) -> None:
        """``versions``: stable first. The tokenizers and the serializer are bound here only so that
        Serve deploys them as part of this application; the router calls them directly."""
        self._models = [v.model for v in versions]
        self._inference = [v.inference for v in versions]
        self._config = ModelCardConfig()

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._config = ModelCardConfig.model_validate(user_config)

    def card(self) -> ModelCard:
        share = self._config.candidate_share if len(self._models) > 1 else 0.0
        roles: list[tuple[Role, float]] = [("stable", 1.0 - share), ("candidate", share)]
        lanes = tuple(
            LaneCard.of(m.manifest, role, s) for m, (role, s) in zip(self._models, roles, strict=False)
        )
        return ModelCard(name=self._models[0].manifest.name, lanes=lanes)

    async def ready(self) -> list[ModelIdentity]:
        """Answers once every served version has an inference replica with its model loaded."""
        calls = [handle.ready.remote() for handle in self._inference]
        try:
            return list(await asyncio.wait_for(asyncio.gather(*calls), READY_TIMEOUT_S))
        except BaseException:
            for call in calls:
                call.cancel()
            raise
