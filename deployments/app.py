"""Application builder named by ``serve_config.yaml`` (``import_path: deployments.app:build_app``)."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from deployments.config import AppArgs
from deployments.ingress.routing import Lane
from deployments.ingress.server import Ingress
from deployments.pipeline.inference import InferenceDeployment
from deployments.pipeline.stages import SerializerDeployment, TokenizerDeployment
from deployments.repository.resolve import resolve_model

# Deployment name prefix per role. Names follow the role, not the version, so that a new stable version
# is a rolling update of the same deployments (new replicas up and warm before old ones drain).
ROLES = ("", "Candidate")


def build_app(args: dict[str, Any]) -> Application:
    """Build the graph. Refuses (raises ManifestError naming the field) when a model does not check out."""
    config = AppArgs.model_validate(args or {})
    lanes = []
    for role, model_config in zip(ROLES, config.served_models(), strict=False):
        model = resolve_model(model_config, hash_files=config.runtime.verify_checksums)
        obs = config.observability
        tokenizer = TokenizerDeployment.options(name=f"{role}Tokenizer").bind(model, obs)
        inference = InferenceDeployment.options(name=f"{role}Inference").bind(
            model, model_config.device, config.runtime, obs
        )
        lanes.append(Lane(model=model, tokenizer=tokenizer, inference=inference))
    serializer = SerializerDeployment.bind(config.observability)
    return Ingress.bind(lanes, serializer, config.limits, config.observability)
