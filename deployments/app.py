"""Application builders named by ``serve_config.yaml``.

``build_router`` is the HTTP application: one ingress that routes by the request's ``model``.
``build_model`` is one model's application: its pipeline (``Model``: groups concurrent requests, drives
the stages, holds the card), its tokenizer and batched inference deployments (one pair per served
version) and its serializer; for a ``generate`` model, its generator (prompt → continuous batching →
streamed text). Each model is its own application, so a
new version of one model rolls that model's replicas only.
"""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from deployments.config import ModelAppArgs, RouterArgs
from deployments.ingress.server import Ingress
from deployments.pipeline.card import INFERENCE, ROLE_PREFIX, TOKENIZER, Role
from deployments.pipeline.generator import GeneratorDeployment, check_generation
from deployments.pipeline.inference import InferenceDeployment
from deployments.pipeline.model import ModelDeployment, ServedVersion
from deployments.pipeline.stages import SerializerDeployment, TokenizerDeployment
from deployments.repository.resolve import resolve_model

ROLES: tuple[Role, ...] = ("stable", "candidate")


def build_router(args: dict[str, Any]) -> Application:
    return Ingress.bind(RouterArgs.model_validate(args or {}))


def build_model(args: dict[str, Any]) -> Application:
    """Refuses (raises ManifestError naming the model and the field) when a version does not check out."""
    config = ModelAppArgs.model_validate(args or {})
    obs = config.observability
    if (
        config.model.task == "generate"
    ):  # one deployment: prompt, engine and detokenizer (pipeline/generator.py)
        model = resolve_model(config.model, hash_files=config.runtime.verify_checksums)
        draft = None
        if (spec := config.generation.speculative) is not None and spec.draft is not None:
            named = {"name": spec.draft.name, "version": spec.draft.version}
            draft = resolve_model(
                config.model.model_copy(update=named), hash_files=config.runtime.verify_checksums
            )
        check_generation(model, config.generation, draft)  # here too: `serve run` fails before any replica
        return GeneratorDeployment.bind(
            model, config.model.device, config.generation, obs, config.runtime, draft
        )
    versions = []
    for role, model_config in zip(ROLES, config.served_models(), strict=False):
        model = resolve_model(model_config, hash_files=config.runtime.verify_checksums)
        prefix = ROLE_PREFIX[role]
        tokenizer = TokenizerDeployment.options(name=prefix + TOKENIZER).bind(model, obs)
        inference = InferenceDeployment.options(name=prefix + INFERENCE).bind(
            model, model_config.device, config.runtime, obs
        )
        versions.append(ServedVersion(model=model, tokenizer=tokenizer, inference=inference))
    serializer = SerializerDeployment.bind(obs, [v.model for v in versions])
    return ModelDeployment.bind(versions, serializer, obs)
